// The memory planner: its closed-form terms on a model small enough to add up by hand, and its
// predictions against the real ledgers of host-backend runs on thread ranks (every
// allocation real) for several policies and budgets: every category's measured peak at or
// below the plan, the total within 5%.
#include <doctest/doctest.h>

#include <cmath>
#include <mutex>
#include <sstream>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/testing/plan_check.hpp"
#include "../support/policies.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

using test_support::host_offload_policies;
using test_support::on_demand_policies;

struct measured {
  memory_ledger device;
  std::optional<memory_ledger> host;
};

// Every rank's ledgers after `steps` steps of the schedule (peaks over the whole run).
template <class Policies>
std::vector<measured> run_host(const model_spec& spec, const engine_config& cfg, int world,
                               const step_schedule& schedule, int steps = 3) {
  std::mutex mu;
  std::vector<measured> out;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, spec, cfg);
    for (int s = 0; s < steps; ++s) run_step(eng, schedule);
    measured m{backend.ledger(), std::nullopt};
    if (&eng.offloader().state_ledger() != &backend.ledger()) m.host = eng.offloader().state_ledger();
    std::lock_guard lock(mu);
    out.push_back(std::move(m));
  });
  return out;
}

void check_plan(const memory_plan& plan, const std::vector<measured>& ranks) {
  for (const measured& r : ranks) {
    std::ostringstream table;
    print_plan(table, plan, &r.device, r.host ? &*r.host : nullptr);
    INFO(table.str());
    ZSHARD_CHECK_PEAK_WITHIN_PLAN(r.device, plan.device);  // the users' helper, testing/plan_check.hpp
    CHECK(testing::peak_over_plan(r.device, plan.device).empty());
    CHECK(double(plan.device.total_peak) <= 1.05 * double(r.device.total_peak()));
    if (r.host) {
      for (std::size_t i = 0; i < mem_category_count; ++i) CHECK(r.host->peak(mem_category(i)) == plan.host.peak[i]);
    } else {
      CHECK(plan.host.total_peak == 0);
    }
  }
}

transformer_shape tiny(bool tied = false) { return {"tiny", 3, 64, 160, 4, 2, 96, tied}; }

}  // namespace

TEST_CASE("plan: closed-form terms of a one-module model") {
  model_spec spec;
  const param_id w = spec.add_param("w", {10});
  const module_id m = spec.add_module("m", {w});
  engine_config cfg;  // f32
  const step_schedule schedule{{{m, 100, 0, false}}, 1};
  const memory_plan plan = plan_memory(spec, cfg, 3, schedule);
  // 10 elements over 3 ranks: shard 4, padded 12.
  CHECK(plan.device.peak_of(mem_category::sharded_params) == 4 * 4);
  CHECK(plan.device.peak_of(mem_category::optimizer_state) == 3 * 4 * 4);
  CHECK(plan.device.peak_of(mem_category::grad_shards) == 4 * 4);
  CHECK(plan.device.peak_of(mem_category::gathered_params) == 12 * 4);
  CHECK(plan.device.peak_of(mem_category::grad_buckets) == 12 * 4);
  CHECK(plan.device.peak_of(mem_category::activations) == 100);
  // The cross-rank settings check at construction: one exchange of every schedule-shaping
  // setting, send and receive buffers at once (8 bytes a setting, per rank and once more).
  const std::size_t settings_check = 8 * schedule_settings(spec, cfg, {}, 3).size() * (1 + 3);
  CHECK(plan.device.peak_of(mem_category::scratch) == settings_check);
  // Backward entry: gathered + full gradient + activations, on top of the constant terms; the
  // gradient waits in the (default, large) bucket until end_backward. The settings check at
  // initialization (with the constant terms) may be larger on a model this small.
  const std::size_t at_init = 16 + 48 + 16 + settings_check, backward = 16 + 48 + 16 + 48 + 48 + 100;
  CHECK(plan.device.total_peak == std::max(at_init, backward));
  CHECK(plan.device.peak_phase == (backward >= at_init ? "step 1: backward of m" : "initialization"));
  // A bucket it fills is reduced as the scope closes: the reduce output joins the peak.
  cfg.reduce.reduce_bucket_numel = 12;
  const memory_plan flushing = plan_memory(spec, cfg, 3, schedule);
  CHECK(flushing.device.total_peak == std::max(at_init, backward + 16));
  CHECK(plan.max_gathered_numel == 12);
  CHECK(plan.host.total_peak == 0);

  const memory_plan offloaded =
      plan_memory(spec, engine_config{}, 3, schedule, {.optimizer = optimizer_location::host});
  CHECK(offloaded.device.peak_of(mem_category::optimizer_state) == 0);
  CHECK(offloaded.host.peak_of(mem_category::optimizer_state) == 3 * 4 * 32);  // shard rounded to the tile granule
  CHECK(offloaded.host.peak_of(mem_category::grad_shards) == 4 * 32);
  CHECK(offloaded.fits(offloaded.device.total_peak));
  CHECK_FALSE(offloaded.fits(offloaded.device.total_peak - 1));
}

TEST_CASE("plan: configurations the engine refuses are refused") {
  const auto model = build_transformer(tiny());
  const auto schedule = transformer_schedule(model, {.micro_batch = 1, .seq_len = 8});
  engine_config cfg;
  CHECK_THROWS_AS(plan_memory(model.spec, cfg, 0, schedule), error);
  cfg.prefetch.max_live_numel = 1000;  // below the embedding's 96 x 64
  try {
    plan_memory(model.spec, cfg, 2, schedule);
    FAIL("expected a configuration error");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::config);
    CHECK(std::string(e.what()).find("allow_oversized_module") != std::string::npos);
  }
  // A backward without a counted forward: refused with the HookTracker's own words.
  step_program orphan = to_program(schedule);
  orphan.events.erase(orphan.events.begin(), orphan.events.begin() + 3);  // embed's forward (open, activations, close)
  try {
    plan_memory(model.spec, engine_config{}, 2, orphan);
    FAIL("expected a usage error");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::usage);
    CHECK(std::string(e.what()).find("no counted forward pending") != std::string::npos);
  }
}

TEST_CASE("plan: the Llama shapes have their published parameter counts") {
  CHECK(std::abs(double(llama3_8b().param_count()) - 8.03e9) < 0.01e9);
  CHECK(std::abs(double(llama3_70b().param_count()) - 70.55e9) < 0.01e9);
  CHECK(transformer_shape_named("llama3-70b")->layers == 80);
  CHECK(transformer_shape_named("llama3_8b")->hidden == 4096);
  CHECK_FALSE(transformer_shape_named("llama2-7b").has_value());
  const auto model = build_transformer(tiny(true));
  CHECK(model.spec.total_numel() == std::size_t(tiny(true).param_count()));
  CHECK(model.spec.module(model.head).params.back() == model.spec.module(model.embed).params.front());  // tied
}

TEST_CASE("plan vs host backend: on-demand, small buckets, optimizer on the device, world 2") {
  const auto model = build_transformer(tiny());
  const auto schedule = transformer_schedule(model, {.micro_batch = 2, .seq_len = 16, .micro_batches = 2});
  engine_config cfg;
  cfg.reduce.reduce_bucket_numel = 12000;  // flushes inside blocks and carries over between them
  const memory_plan plan = plan_memory(model.spec, cfg, 2, schedule, {.prefetcher = prefetch_policy::on_demand});
  check_plan(plan, run_host<on_demand_policies>(model.spec, cfg, 2, schedule));
}

TEST_CASE("plan vs host backend: trace prefetch within budgets, reuse, replicated norms, host optimizer, world 3") {
  const auto model = build_transformer(tiny(true));
  const auto schedule = transformer_schedule(model, {.micro_batch = 1, .seq_len = 16, .micro_batches = 2});
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
  cfg.partition.persistence_threshold_numel = 64;  // norm gains stay replicated
  cfg.partition.shard_alignment_numel = 16;
  cfg.prefetch.prefetch_numel = 40'000;  // about one block ahead
  cfg.prefetch.max_live_numel = 70'000;  // binds: the window does not always fit
  cfg.prefetch.max_reuse_distance = 1;   // keeps a recomputed block for its backward
  cfg.reduce.reduce_bucket_numel = 30'000;
  const memory_plan plan = plan_memory(model.spec, cfg, 3, schedule, {.optimizer = optimizer_location::host});
  check_plan(plan, run_host<host_offload_policies>(model.spec, cfg, 3, schedule));
}

TEST_CASE("plan vs host backend: no checkpointing, f32, default budgets (the whole model prefetched)") {
  const auto model = build_transformer(tiny());
  const auto schedule = transformer_schedule(model, {.micro_batch = 2, .seq_len = 8, .checkpoint = false});
  for (int world : {2, 3}) {
    const memory_plan plan = plan_memory(model.spec, engine_config{}, world, schedule);
    INFO("world " << world);
    check_plan(plan, run_host<default_policies>(model.spec, engine_config{}, world, schedule));
  }
}

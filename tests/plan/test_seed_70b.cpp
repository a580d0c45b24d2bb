// The seed scenario (bench/seed_scenario.hpp): Llama-3-70B at the granularity of DeepSpeed's
// hooks on 8 ranks, bf16, optimizer state on the host, each block a checkpointed segment, 3
// steps x 2 micro-batches, simulated on the phantom backend. Its per-rank peak is flat, within
// the plan and under 80 GiB, and the Prefetcher gathers ahead; each of the three legacy
// mechanisms (tests/support/legacy/) alone breaks the 80 GiB device budget; the planner matches
// phantom runs of other shapes within 5%; I5/I6 hold on a tied 70B.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/testing/invariants.hpp"
#include "../../bench/seed_legacy.hpp"

using namespace zshard;
using namespace zshard::plan;
using namespace zshard_bench;

namespace {

double relative_error(std::size_t planned, std::size_t measured) {
  return std::abs(double(planned) - double(measured)) / double(measured);
}


// Logs from the engine and its policies (a prefetch trace divergence would be one).
struct captured_log {
  std::string text;
  engine_config attach(engine_config c) {
    c.log = [this](const std::string& line) { text += line + "\n"; };
    return c;
  }
};

// The seed's budgets without zshard's max_live_numel: the legacy had no derived resident count.
engine_config without_max_live(const seed_scenario& seed) {
  engine_config c = seed.config();
  c.prefetch.max_live_numel = std::size_t{1} << 50;
  return c;
}

// Whether `Policies` breaks the 80 GiB of the device (the ledger's budget), and how.
template <class Policies>
std::string device_budget_failure(const seed_scenario& seed, const transformer_model& model,
                                  const training_schedule& schedule) {
  try {
    run_phantom<Policies>(model.spec, without_max_live(seed), seed.world, schedule, seed.steps, seed.device_budget);
  } catch (const error& e) {
    return e.kind() == error_kind::budget ? e.what() : std::string("not a budget error: ") + e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("seed: 70B at hook granularity is planned, bounded and flat, and gathers ahead") {
  const seed_scenario seed;
  const transformer_model model = seed.model();
  const training_schedule schedule{{seed.program(model)}};
  captured_log logs;
  const engine_config cfg = logs.attach(seed.config());
  const memory_plan plan = plan_memory(model.spec, cfg, seed.world, schedule, seed.options());
  const phantom_result run =
      run_phantom<seed_policies>(model.spec, cfg, seed.world, schedule, seed.steps, seed.device_budget);

  std::ostringstream table;
  print_plan(table, plan, &run.peak_step(), run.host ? &*run.host : nullptr);
  INFO(table.str());
  CHECK(logs.text.empty());
  REQUIRE(run.steps.size() == 3);
  for (const auto& r : run.reports) {
    CHECK(r.micro_batches == 2);
    CHECK_FALSE(r.skipped);
    CHECK(r.swept.empty());
  }
  CHECK(model.spec.modules().size() == 2 + 9 * 80);
  CHECK(run.scopes_with_gathers_ahead > 0);  // K and V gathered ahead, block after block
  CHECK(run.scopes_with_gathers_ahead >= 2 * 80);

  // No growth: the per-rank peak is the same bytes in every step once the trace replays.
  for (std::size_t s = 2; s < run.steps.size(); ++s) CHECK(run.steps[s].total_peak() == run.steps[1].total_peak());
  CHECK(run.steps_with_growth() == 0);
  for (std::size_t i = 0; i < mem_category_count; ++i)
    CHECK(run.steps.back().current(mem_category(i)) == run.after_construction.current(mem_category(i)));

  // Bounded by the plan, which is within 5% of the run; it fits 80 GiB with the GPU's own terms.
  const std::size_t peak = run.peak();
  CHECK(peak <= plan.device.total_peak);
  CHECK(relative_error(plan.device.total_peak, peak) < 0.05);
  CHECK(plan.fits(seed.device_budget));
  CHECK(plan.device_total() > plan.device.total_peak + (std::size_t{1} << 30));  // context, NCCL, workspace, pool
  for (std::size_t i = 0; i < mem_category_count; ++i)
    CHECK(run.peak_step().peak(mem_category(i)) <= plan.device.peak[i]);

  CHECK(std::abs(double(model.spec.total_numel()) - 70.55e9) < 0.01e9);
  CHECK(run.after_construction.current(mem_category::optimizer_state) == 0);
  REQUIRE(run.host.has_value());
  CHECK(run.host->total_peak() == plan.host.total_peak);
  CHECK(std::abs(double(plan.host.total_peak) / (16.0 * 70.55e9 / 8) - 1.0) < 0.01);
}

TEST_CASE("seed: each legacy mechanism alone breaks the 80 GiB device budget; the default stays flat") {
  const seed_scenario seed;
  const transformer_model model = seed.model();
  const training_schedule schedule{{seed.program(model)}};
  // The same budgets, max_live_numel lifted for everyone: the default policies stay well under.
  const phantom_result healthy = run_phantom<seed_policies>(model.spec, without_max_live(seed), seed.world, schedule,
                                                            seed.steps, seed.device_budget);
  CHECK(healthy.peak() < seed.device_budget / 2);
  CHECK(healthy.steps_with_growth() == 0);

  const std::string tracker = device_budget_failure<legacy_tracker_policies>(seed, model, schedule);
  const std::string prefetch = device_budget_failure<legacy_prefetch_policies>(seed, model, schedule);
  const std::string reducer = device_budget_failure<legacy_reducer_policies>(seed, model, schedule);
  for (const std::string* why : {&tracker, &prefetch, &reducer}) {
    INFO(*why);
    CHECK(why->find("phantom rank 0: request of") != std::string::npos);  // the device ledger's 80 GiB
    CHECK(why->find("exceeds the budget of 85899345920 bytes") != std::string::npos);
    CHECK(why->find("max_live_numel =") == std::string::npos);  // not zshard's own check
  }
  CHECK(prefetch.find("for gathered_params") != std::string::npos);
  CHECK(reducer.find("for grad_buckets") != std::string::npos);

  // Without a device budget: how far each goes (every block's weights held; every gradient copied).
  const std::size_t blocks_bytes = std::size_t(seed.shape.layers) * std::size_t(seed.shape.block_numel()) * 2;
  const phantom_result t =
      run_phantom<legacy_tracker_policies>(model.spec, without_max_live(seed), seed.world, schedule, 2);
  CHECK(t.peak_step().peak(mem_category::gathered_params) >= blocks_bytes);
  const phantom_result r =
      run_phantom<legacy_reducer_policies>(model.spec, without_max_live(seed), seed.world, schedule, 2);
  CHECK(r.peak_step().peak(mem_category::grad_buckets) >= 2 * blocks_bytes);  // f32: twice the bf16 bytes
}

TEST_CASE("seed: the planner matches phantom runs of other shapes and settings within 5%") {
  struct variant {
    transformer_shape shape;
    int world;
    bool checkpoint, hooks;
    optimizer_location optimizer;
  };
  const variant variants[] = {
      {llama3_8b(), 1, true, false, optimizer_location::device},
      {llama3_8b(), 4, true, true, optimizer_location::host},
      {llama3_8b(), 8, false, true, optimizer_location::device},
      {llama3_8b(), 8, true, false, optimizer_location::host},
      {llama3_70b(), 4, false, false, optimizer_location::host},
      {llama3_70b(), 8, true, true, optimizer_location::device},
  };
  const seed_scenario seed;
  for (const auto& v : variants) {
    const transformer_model model = v.hooks ? build_transformer_hooks(v.shape) : build_transformer(v.shape);
    activation_options act = seed.activations;
    act.checkpoint = v.checkpoint;
    const training_schedule schedule{
        {v.hooks ? transformer_hook_program(model, act) : to_program(transformer_schedule(model, act))}};
    const engine_config cfg = seed.config();
    const memory_plan plan = plan_memory(model.spec, cfg, v.world, schedule, {.optimizer = v.optimizer});
    phantom_result run;
    if (v.optimizer == optimizer_location::host)
      run = run_phantom<seed_policies>(model.spec, cfg, v.world, schedule, 2);
    else
      run = run_phantom(model.spec, cfg, v.world, schedule, 2);
    std::ostringstream table;
    print_plan(table, plan, &run.peak_step(), run.host ? &*run.host : nullptr);
    INFO(v.shape.name << ", world " << v.world << ", checkpoint " << v.checkpoint << ", hooks " << v.hooks << "\n"
                      << table.str());
    CHECK(run.peak() <= plan.device.total_peak);
    CHECK(relative_error(plan.device.total_peak, run.peak()) < 0.05);
    for (std::size_t i = 0; i < mem_category_count; ++i)
      CHECK(run.peak_step().peak(mem_category(i)) <= plan.device.peak[i]);
    if (run.host) CHECK(run.host->total_peak() == plan.host.total_peak);
  }
}

TEST_CASE("I5/I6 checks: quiet on a correct tied 70B (the tied gradient waits), loud on a copying Reducer") {
  transformer_shape shape = llama3_70b();
  shape.tied_embeddings = true;
  const transformer_model model = build_transformer_hooks(shape);
  const seed_scenario seed;
  const step_program step = transformer_hook_program(model, seed.activations);
  auto violations = [&]<class Policies>(Policies) {
    phantom_backend backend;
    null_comm comm(0, seed.world);
    engine<phantom_backend, null_comm, Policies> eng(backend, comm, model.spec, seed.config());
    run_program(eng, step);
    backend.ledger().reset_peaks();
    run_program(eng, step);
    ZSHARD_CHECK_STEP_INVARIANTS(eng);
    // The tied weight's f32 gradient (1.05e9 elements, 3.9 GiB) lives from head's backward to
    // embed's, on top of a bucket: above the old "bucket + largest module" bound.
    const std::size_t old_bound = (seed.config().reduce.reduce_bucket_numel + 128256 * 8192) * 4;
    if constexpr (std::is_same_v<Policies, seed_policies>)
      CHECK(backend.ledger().peak(mem_category::grad_buckets) > old_bound);
    return testing::memory_bound_violations(eng);
  };
  const auto quiet = violations(seed_policies{});
  CHECK(quiet.empty());
  const auto loud = violations(legacy_reducer_policies{});
  REQUIRE(loud.size() == 1);
  CHECK(loud[0].find("(I6)") != std::string::npos);
}

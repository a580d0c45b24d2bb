// The seed scenario (plan/seed_scenario.hpp): Llama-3-70B on 8 ranks, bf16, optimizer state on
// the host, checkpointing per block, 3 steps x 2 micro-batches, simulated on the phantom
// backend. Its per-rank peak is flat from step 2 on, within the plan and under 80 GiB; the
// planner matches the phantom run within 5% here and on other shapes and settings; and the
// legacy tracker (the regression DESIGN.md starts from) breaks the same run.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/seed_scenario.hpp"
#include "zshard/testing/legacy_tracker.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

double relative_error(std::size_t planned, std::size_t measured) {
  return std::abs(double(planned) - double(measured)) / double(measured);
}

struct legacy_policies : seed_policies {
  using hook_tracker = testing::legacy_tracker;
};

// Logs from the engine and its policies (a prefetch trace divergence would be one).
struct captured_log {
  std::string text;
  engine_config attach(engine_config c) {
    c.log = [this](const std::string& line) { text += line + "\n"; };
    return c;
  }
};

}  // namespace

TEST_CASE("seed: 70B on 8 ranks is planned, bounded and flat from step 2 on") {
  const seed_scenario seed;
  const transformer_model model = build_transformer(seed.shape);
  const step_schedule schedule = transformer_schedule(model, seed.activations);
  captured_log logs;
  const engine_config cfg = logs.attach(seed.config());
  const memory_plan plan = plan_memory(model.spec, cfg, seed.world, schedule, seed.options());
  const phantom_result run = run_phantom<seed_policies>(model.spec, cfg, seed.world, schedule, seed.steps, seed.device_budget);

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

  // No growth: the per-rank peak is the same bytes in every step once the trace replays.
  for (std::size_t s = 2; s < run.steps.size(); ++s) CHECK(run.steps[s].total_peak() == run.steps[1].total_peak());
  CHECK(run.steps_with_growth() == 0);
  for (std::size_t i = 0; i < mem_category_count; ++i)
    CHECK(run.steps.back().current(mem_category(i)) == run.after_construction.current(mem_category(i)));

  // Bounded by the plan, which is within 5% of the run, and under the 80 GiB of a rank.
  const std::size_t peak = run.peak();
  CHECK(peak <= plan.device.total_peak);
  CHECK(relative_error(plan.device.total_peak, peak) < 0.05);
  CHECK(peak < seed.device_budget);
  CHECK(plan.fits(seed.device_budget));
  for (std::size_t i = 0; i < mem_category_count; ++i)
    CHECK(run.peak_step().peak(mem_category(i)) <= plan.device.peak[i]);

  // The shape is 70.6e9 parameters: bf16 shards are a 1/8 of 141 GB, and no optimizer state is
  // on the device.
  CHECK(seed.shape.param_count() == std::int64_t(model.spec.total_numel()));
  CHECK(std::abs(double(model.spec.total_numel()) - 70.55e9) < 0.01e9);
  CHECK(run.after_construction.current(mem_category::optimizer_state) == 0);
  CHECK(run.after_construction.current(mem_category::grad_shards) == 0);

  // Offloaded state per rank: 16 bytes per parameter of the shard, on the host ledger.
  REQUIRE(run.host.has_value());
  CHECK(run.host->total_peak() == plan.host.total_peak);
  CHECK(std::abs(double(plan.host.total_peak) / (16.0 * 70.55e9 / 8) - 1.0) < 0.01);
}

TEST_CASE("seed: the legacy tracker breaks the same run (over budget, or growing)") {
  const seed_scenario seed;
  const transformer_model model = build_transformer(seed.shape);
  const step_schedule schedule = transformer_schedule(model, seed.activations);
  bool broken = false;
  std::string why;
  try {
    const phantom_result run =
        run_phantom<legacy_policies>(model.spec, seed.config(), seed.world, schedule, seed.steps, seed.device_budget);
    broken = run.peak() > seed.device_budget || run.steps_with_growth() == int(run.steps.size()) - 1;
    why = "peak " + format_bytes(double(run.peak()));
  } catch (const error& e) {
    broken = e.kind() == error_kind::budget;
    why = e.what();
  }
  INFO(why);
  CHECK(broken);

  // With neither budget (device bytes, max_live_numel) it shows why: every block's weights
  // stay gathered through backward.
  engine_config unbounded = seed.config();
  unbounded.prefetch.max_live_numel = std::size_t{1} << 50;
  const phantom_result free_run = run_phantom<legacy_policies>(model.spec, unbounded, seed.world, schedule, 2);
  const std::size_t block_bytes = std::size_t(seed.shape.block_numel()) * 2;
  CHECK(free_run.peak_step().peak(mem_category::gathered_params) >= std::size_t(seed.shape.layers) * block_bytes);
  CHECK(free_run.peak() > seed.device_budget);
}

TEST_CASE("seed: the planner matches phantom runs of other shapes and settings within 5%") {
  struct variant {
    transformer_shape shape;
    int world;
    bool checkpoint;
    optimizer_location optimizer;
  };
  const variant variants[] = {
      {llama3_8b(), 1, true, optimizer_location::device},  {llama3_8b(), 4, true, optimizer_location::host},
      {llama3_8b(), 8, false, optimizer_location::device}, {llama3_8b(), 8, true, optimizer_location::host},
      {llama3_70b(), 4, false, optimizer_location::host},  {llama3_70b(), 8, true, optimizer_location::device},
  };
  const seed_scenario seed;
  for (const auto& v : variants) {
    const transformer_model model = build_transformer(v.shape);
    activation_options act = seed.activations;
    act.checkpoint = v.checkpoint;
    const step_schedule schedule = transformer_schedule(model, act);
    const engine_config cfg = seed.config();
    const memory_plan plan = plan_memory(model.spec, cfg, v.world, schedule, {.optimizer = v.optimizer});
    phantom_result run;
    if (v.optimizer == optimizer_location::host) run = run_phantom<seed_policies>(model.spec, cfg, v.world, schedule, 2);
    else run = run_phantom(model.spec, cfg, v.world, schedule, 2);
    std::ostringstream table;
    print_plan(table, plan, &run.peak_step(), run.host ? &*run.host : nullptr);
    INFO(v.shape.name << ", world " << v.world << ", checkpoint " << v.checkpoint << "\n" << table.str());
    CHECK(run.peak() <= plan.device.total_peak);
    CHECK(relative_error(plan.device.total_peak, run.peak()) < 0.05);
    for (std::size_t i = 0; i < mem_category_count; ++i)
      CHECK(run.peak_step().peak(mem_category(i)) <= plan.device.peak[i]);
    if (run.host) CHECK(run.host->total_peak() == plan.host.total_peak);
  }
}

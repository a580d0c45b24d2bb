// The plan bounds the run (I10), checked on random models (random_models.hpp) against the real
// engine on the phantom backend: in every ledger category and in total, the run's peak over
// all its steps is at or below the plan; on simple schedules (one sequential program, loose
// budgets) the plan is within 5% of the run; a schedule the planner refuses, the engine
// refuses too, and the other way round. Also the named regression the old planner failed.
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "random_models.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int model_count = 1500;  // the sanitizers run every engine call 5-20x slower
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int model_count = 1500;
#else
constexpr int model_count = 13000;
#endif
#else
constexpr int model_count = 13000;
#endif

// The run's peak per category over every step (and construction).
std::array<std::size_t, mem_category_count> run_peaks(const phantom_result& r) {
  std::array<std::size_t, mem_category_count> p{};
  for (std::size_t i = 0; i < mem_category_count; ++i) {
    p[i] = r.after_construction.peak(mem_category(i));
    for (const auto& s : r.steps) p[i] = std::max(p[i], s.peak(mem_category(i)));
  }
  return p;
}

std::string describe(const plan_test::random_case& c, const memory_plan& plan, const phantom_result& run) {
  std::ostringstream os;
  os << "world " << c.world << ", max_live " << c.cfg.prefetch.max_live_numel << ", prefetch "
     << c.cfg.prefetch.prefetch_numel << ", reuse " << c.cfg.prefetch.max_reuse_distance << ", bucket "
     << c.cfg.reduce.reduce_bucket_numel << ", programs " << c.schedule.cycle.size() << "\n";
  print_plan(os, plan, &run.peak_step());
  return os.str();
}

}  // namespace

TEST_CASE("plan >= run on random models in every category, and within 5% on simple schedules") {
  plan_test::case_generator gen(0x5eed'0012);
  int checked = 0, simple = 0, refused = 0;
  double worst_simple = 1.0, worst_any = 1.0, lowest = 1e9;
  for (int i = 0; i < model_count; ++i) {
    const bool is_simple = i % 4 == 0;
    const plan_test::random_case c = gen.next(is_simple);
    std::optional<memory_plan> plan;
    std::string plan_error;
    try {
      plan = plan_memory(c.spec, c.cfg, c.world, c.schedule, {.initialization = false});
    } catch (const error& e) {
      plan_error = e.what();
    }
    const int steps =
        plan ? plan->steps_simulated + int(c.schedule.cycle.size()) : 2 * int(c.schedule.cycle.size()) + 2;
    std::optional<phantom_result> run;
    std::string run_error;
    try {
      run = run_phantom(c.spec, c.cfg, c.world, c.schedule, steps);
    } catch (const error& e) {
      run_error = e.what();
    }
    INFO("model #" << i << "\nplan: " << plan_error << "\nrun: " << run_error);
    REQUIRE(plan.has_value() == run.has_value());  // both refuse, or neither
    if (!plan) {
      ++refused;
      continue;
    }
    ++checked;
    const auto peaks = run_peaks(*run);
    const std::size_t total = run->peak();
    bool ok = total <= plan->device.total_peak;
    for (std::size_t k = 0; k < mem_category_count; ++k) ok = ok && peaks[k] <= plan->device.peak[k];
    const double ratio = double(plan->device.total_peak) / double(std::max<std::size_t>(total, 1));
    worst_any = std::max(worst_any, ratio);
    lowest = std::min(lowest, ratio);
    if (c.simple) {
      ++simple;
      worst_simple = std::max(worst_simple, ratio);
      ok = ok && ratio <= 1.05;
    }
    if (!ok) FAIL(describe(c, *plan, *run));
  }
  MESSAGE("random models: " << checked << " planned and run (" << simple << " simple), " << refused
                            << " refused by both; plan/run total: lowest " << lowest << ", worst simple "
                            << worst_simple << ", worst overall " << worst_any);
  CHECK(checked + refused == model_count);
  CHECK(simple >= model_count / 5);
  CHECK(lowest >= 1.0);
}

// The case the first planner got wrong: it replayed gathers ahead in reverse request order, the
// engine admits them first-fit in request order. Modules {320, 160} then {400}, 8 ranks, bf16,
// max_live 800, prefetch 480, reduce bucket 400: the run peaks at 5,220 B; the old plan said
// 5,020 B. The bound now holds whatever the order: 5,380 B.
TEST_CASE("regression: two modules, gathers ahead admitted first-fit, the plan is above the run") {
  model_spec spec;
  const param_id a = spec.add_param("a", {400}), b = spec.add_param("b", {320}), c = spec.add_param("c", {160});
  const module_id small = spec.add_module("m0", {a}), pair = spec.add_module("m1", {b, c});
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
  cfg.prefetch.max_live_numel = 800;
  cfg.prefetch.prefetch_numel = 480;
  cfg.reduce.reduce_bucket_numel = 400;
  const step_schedule schedule{{{pair, 0, 0, false}, {small, 0, 0, false}}, 1};
  const memory_plan plan = plan_memory(spec, cfg, 8, schedule, {.initialization = false});
  const phantom_result run = run_phantom(spec, cfg, 8, schedule, 3);
  std::ostringstream table;
  print_plan(table, plan, &run.peak_step());
  INFO(table.str());
  CHECK(run.peak() == 5220);
  CHECK(plan.device.total_peak >= run.peak());
  CHECK(plan.device.total_peak == 5380);
  for (std::size_t k = 0; k < mem_category_count; ++k)
    CHECK(run.peak_step().peak(mem_category(k)) <= plan.device.peak[k]);
}

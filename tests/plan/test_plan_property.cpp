// The plan bounds the run (I10), checked on random models (random_models.hpp) against the real
// engine on the phantom backend (controlled_run.hpp): in every ledger category and in total, the
// run's peak over all its steps is at or below the plan; on simple schedules (one sequential
// program, loose budgets) the plan is within 5% of the run; a schedule the planner refuses, the
// engine refuses too, and the other way round. The cases include what a run does beside its
// schedule (issue 26): oversized modules with reuse, keep-gathered and recompute holds,
// check_every_scope, no-sync accumulation, unfreezing, and Prefetchers the planner does not
// mirror; the test says how many cases exercised each. Also the named regression the old
// planner failed.
#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>

#include "controlled_run.hpp"
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

std::string describe(const plan_test::random_case& c, const memory_plan& plan, const plan_test::run_peaks& run) {
  std::ostringstream os;
  os << "world " << c.world << ", max_live " << c.cfg.prefetch.max_live_numel << (c.cfg.prefetch.allow_oversized_module ? " (oversized allowed)" : "")
     << ", prefetch " << c.cfg.prefetch.prefetch_numel << ", reuse " << c.cfg.prefetch.max_reuse_distance << ", bucket "
     << c.cfg.reduce.reduce_bucket_numel << ", programs " << c.schedule.cycle.size() << ", prefetcher "
     << int(c.prefetcher) << ", check_every_scope " << c.cfg.check_every_scope << ", no_sync " << c.options.no_sync
     << ", kept " << c.options.keep_gathered_until_backward.size() << ", unfreeze steps " << c.unfreeze.size()
     << ", stages " << c.options.unfreeze_stages.size() << ", stay frozen " << c.options.frozen_params_stay_frozen
     << "\nrun total " << run.total << "; by category:";
  for (std::size_t k = 0; k < mem_category_count; ++k) os << " " << to_string(mem_category(k)) << " " << run.category[k];
  os << "\n";
  print_plan(os, plan);
  return os.str();
}

// How many planned-and-run cases exercised each feature.
struct coverage {
  int oversized_held = 0;  // a module above max_live_numel, and a reuse, keep-gathered or recompute hold
  int check_every_scope = 0, no_sync = 0, kept = 0, unfrozen = 0, staged = 0, custom_prefetcher = 0;
  int hold_evictions = 0;  // runs where the engine evicted a preferred hold to keep the budget
};

// A module larger than max_live_numel ran (the plan's I5 figure says so), and something could
// keep it gathered after its scope: reuse, keep-gathered, or a recompute hold.
bool oversized_and_held(const plan_test::random_case& c, const memory_plan& plan) {
  bool recomputes = false;
  for (const auto& prog : c.schedule.cycle)
    for (const auto& e : prog.events) recomputes = recomputes || (e.kind == event_kind::open && e.scope == scope_kind::recompute);
  const bool held = recomputes || c.cfg.prefetch.max_reuse_distance > 0 || !c.options.keep_gathered_until_backward.empty();
  return held && plan.max_gathered_numel > c.cfg.prefetch.max_live_numel;
}

}  // namespace

TEST_CASE("plan >= run on random models in every category, and within 5% on simple schedules") {
  plan_test::case_generator gen(0x5eed'0026);
  int checked = 0, simple = 0, refused = 0, refused_on_purpose = 0;
  coverage cov;
  double worst_simple = 1.0, worst_any = 1.0, lowest = 1e9;
  for (int i = 0; i < model_count; ++i) {
    const bool is_simple = i % 4 == 0;
    const plan_test::random_case c = gen.next(is_simple);
    std::optional<memory_plan> plan;
    std::string plan_error;
    try {
      plan = plan_memory(c.spec, c.cfg, c.world, c.schedule, c.options);
    } catch (const error& e) {
      plan_error = e.what();
    }
    int last_unfreeze = 0;
    for (const auto& u : c.unfreeze) last_unfreeze = std::max(last_unfreeze, u.first);
    const int steps = last_unfreeze + (plan ? plan->steps_simulated + int(c.schedule.cycle.size())
                                            : 2 * int(c.schedule.cycle.size()) + 2);
    std::optional<plan_test::run_peaks> run;
    std::string run_error;
    try {
      run = plan_test::run_controlled(c, steps);
    } catch (const error& e) {
      run_error = e.what();
    }
    INFO("model #" << i << "\nplan: " << plan_error << "\nrun: " << run_error);
    REQUIRE(plan.has_value() == run.has_value());  // both refuse, or neither
    if (!plan) {
      ++refused;
      refused_on_purpose += c.budget_below_need;
      continue;
    }
    ++checked;
    // I5 with no scope open: an oversized module's leftovers are gone once its scope closes
    CHECK(run->max_resident_after_close <= c.cfg.prefetch.max_live_numel);
    bool ok = run->total <= plan->device.total_peak;
    for (std::size_t k = 0; k < mem_category_count; ++k) ok = ok && run->category[k] <= plan->device.peak[k];
    const double ratio = double(plan->device.total_peak) / double(std::max<std::size_t>(run->total, 1));
    worst_any = std::max(worst_any, ratio);
    lowest = std::min(lowest, ratio);
    if (c.simple) {
      ++simple;
      worst_simple = std::max(worst_simple, ratio);
      ok = ok && ratio <= 1.05;
    }
    if (!ok) FAIL(describe(c, *plan, *run));
    cov.oversized_held += oversized_and_held(c, *plan);
    cov.check_every_scope += c.cfg.check_every_scope;
    cov.no_sync += c.options.no_sync;
    cov.kept += !c.options.keep_gathered_until_backward.empty();
    cov.unfrozen += !c.unfreeze.empty();
    cov.staged += !c.options.unfreeze_stages.empty();
    cov.custom_prefetcher += c.prefetcher != plan_test::custom_prefetcher::none;
    cov.hold_evictions += run->hold_evictions > 0;
  }
  MESSAGE("random models: " << checked << " planned and run (" << simple << " simple), " << refused
                            << " refused by both (" << refused_on_purpose
                            << " with a budget chosen below what their nested scopes need); plan/run total: lowest "
                            << lowest << ", worst simple " << worst_simple << ", worst overall " << worst_any);
  MESSAGE("features among those planned and run: oversized module " << cov.oversized_held << ", check_every_scope "
                                                                   << cov.check_every_scope << ", no-sync " << cov.no_sync
                                                                   << ", keep-gathered " << cov.kept << ", unfreezing "
                                                                   << cov.unfrozen << " (in stages " << cov.staged
                                                                   << "), custom Prefetcher " << cov.custom_prefetcher
                                                                   << ", preferred holds evicted " << cov.hold_evictions);
  CHECK(checked + refused == model_count);
  CHECK(simple >= model_count / 5);
  CHECK(checked >= model_count * 8 / 10);
  CHECK(lowest >= 1.0);
  for (int n : {cov.oversized_held, cov.check_every_scope, cov.no_sync, cov.kept, cov.unfrozen, cov.staged,
                cov.custom_prefetcher, cov.hold_evictions})
    CHECK(n >= model_count / 100);
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

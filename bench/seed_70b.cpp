// The seed scenario (bench/seed_scenario.hpp), simulated: Llama-3-70B at DeepSpeed's hook
// granularity, 8 ranks, bf16, optimizer state on the host, each block a checkpointed segment,
// 3 steps x 2 micro-batches of 1 x 4096 tokens. Questions: what does each rank hold at its
// peak, by ledger category, and does the planner say so before the run? Is the peak flat from
// step to step, and does prefetch gather ahead? What does each legacy mechanism of the original
// failure (tests/support/legacy/: the drifting tracker, the reset live count, the copying
// reducer) do with the same run? How long does planning 100k parameters take? And what does
// the engine's own bookkeeping cost per module scope (phantom backend: no math, no copies, no
// communication)?
//
// Prints tables, then the key figures as `name: value`.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/trace/trace_sink.hpp"
#include "../tests/support/policies.hpp"
#include "many_small_modules.hpp"
#include "seed_legacy.hpp"

using namespace zshard;
using namespace zshard::plan;
using namespace zshard_bench;

namespace {

using on_demand_policies = test_support::on_demand_policies;

double gib(std::size_t bytes) { return double(bytes) / double(std::size_t{1} << 30); }

// Engine time per module scope: `modules` modules of two small parameters each, forward in
// order then backward in reverse (begin/end_backward included: they are per micro-batch).
// step() is timed apart: it runs once per optimizer step, over every parameter.
struct overhead {
  double per_scope_ns = 0;
  double step_per_param_ns = 0;
};
template <class Policies>
overhead engine_overhead(int modules, int steps, std::size_t max_reuse_distance = 0, trace_sink* trace = nullptr) {
  const model_spec spec = bench::many_small_modules(modules);
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
  cfg.prefetch.max_reuse_distance = max_reuse_distance;
  cfg.trace = trace;
  phantom_backend backend;
  null_comm comm(0, 8);
  engine<phantom_backend, null_comm, Policies> eng(backend, comm, spec, cfg);
  using clock = std::chrono::steady_clock;
  clock::duration in_scopes{}, in_step{};
  for (int s = -2; s < steps; ++s) {  // two warm-up steps: the first records the prefetch trace
    const auto t0 = clock::now();
    for (module_id m = 0; m < spec.modules().size(); ++m) eng.forward(m).close();
    eng.begin_backward();
    for (module_id m = spec.modules().size(); m-- > 0;) eng.backward(m).close();
    eng.end_backward();
    const auto t1 = clock::now();
    eng.step();
    if (s >= 0) {
      in_scopes += t1 - t0;
      in_step += clock::now() - t1;
    }
  }
  const auto ns = [](clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); };
  return {ns(in_scopes) / (2.0 * double(modules) * double(steps)),
          ns(in_step) / (double(spec.params().size()) * double(steps))};
}

// Planning time for `params` small parameters, two per module, in a chain forwarded then
// backward, with a prefetch window of thousands of scopes and reuse distance on: the case that
// made the first planner quadratic. Also the phantom run of one step of it, for scale.
struct plan_timing {
  double plan_ms = 0, run_ms = 0;
};
plan_timing plan_time(std::size_t params) {
  model_spec spec;
  std::vector<segment> segs;
  for (std::size_t i = 0; i < params / 2; ++i) {
    const std::string n = "m" + std::to_string(i);
    const param_id w = spec.add_param(n + ".w", {32, 32}), b = spec.add_param(n + ".b", {32, 4});
    segs.push_back({{spec.add_module(n, {w, b})}, 1024, 0, false, std::nullopt});
  }
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
  cfg.prefetch.prefetch_numel = 5'000'000;  // ~4,000 scopes ahead
  cfg.prefetch.max_live_numel = 4'000'000;  // binds
  cfg.prefetch.max_reuse_distance = 1'000'000;
  cfg.reduce.reduce_bucket_numel = 1'000'000;
  cfg.log = [](const std::string&) {};
  const training_schedule schedule{{training_step(segs)}};
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const memory_plan plan = plan_memory(spec, cfg, 8, schedule);
  const auto t1 = clock::now();
  const phantom_result run = run_phantom(spec, cfg, 8, schedule, 1);
  const auto t2 = clock::now();
  if (run.peak() > plan.device.total_peak) std::printf("  (plan below the run: a bug)\n");
  return {std::chrono::duration<double, std::milli>(t1 - t0).count(),
          std::chrono::duration<double, std::milli>(t2 - t1).count()};
}

}  // namespace

int main() {
  const seed_scenario seed;
  const transformer_model model = seed.model();
  const training_schedule schedule{{seed.program(model)}};
  const engine_config cfg = seed.config();

  std::printf(
      "seed scenario: %s (%.2fe9 parameters, %zu modules: DeepSpeed hook granularity), %d ranks, bf16,\n"
      "  optimizer on the host, each block a checkpointed segment, micro-batch %lld x %lld tokens,\n"
      "  %d steps x %d micro-batches, device budget %.0f GiB; max_live_numel 1e9, prefetch_numel 5e7,\n"
      "  reduce_bucket_numel 5e8, persistence threshold 1e5, allow_oversized_module\n\n",
      seed.shape.name.c_str(), double(seed.shape.param_count()) / 1e9, model.spec.modules().size(), seed.world,
      static_cast<long long>(seed.activations.micro_batch), static_cast<long long>(seed.activations.seq_len),
      seed.steps, seed.activations.micro_batches, gib(seed.device_budget));

  const auto t0 = std::chrono::steady_clock::now();
  const memory_plan plan = plan_memory(model.spec, cfg, seed.world, schedule, seed.options());
  const auto t1 = std::chrono::steady_clock::now();
  const phantom_result run =
      run_phantom<seed_policies>(model.spec, cfg, seed.world, schedule, seed.steps, seed.device_budget);
  const auto t2 = std::chrono::steady_clock::now();

  std::printf("per-rank peak by category (plan: computed before the run; run: phantom backend)\n");
  print_plan(std::cout, plan, &run.peak_step(), run.host ? &*run.host : nullptr);
  std::printf("\nstep  peak GiB   gathered  buckets   activations  forward scopes with gathers ahead\n");
  for (std::size_t s = 0; s < run.steps.size(); ++s) {
    const memory_ledger& l = run.steps[s];
    std::printf("%-5zu %-10.3f %-9.3f %-9.3f %-12.3f %s\n", s + 1, gib(l.total_peak()),
                gib(l.peak(mem_category::gathered_params)), gib(l.peak(mem_category::grad_buckets)),
                gib(l.peak(mem_category::activations)),
                s + 1 == run.steps.size() ? std::to_string(run.scopes_with_gathers_ahead).c_str() : "");
  }
  std::printf("plan: %.1f ms; phantom run of %d steps: %.1f ms; rank 0 sends %.1f GiB per step\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(), seed.steps,
              std::chrono::duration<double, std::milli>(t2 - t1).count(), gib(run.bytes_sent_per_step));

  // Each legacy mechanism alone, max_live_numel lifted (the legacy had no derived resident
  // count): against the 80 GiB of the device, then with no budget to see how far it goes.
  engine_config unbounded = cfg;
  unbounded.prefetch.max_live_numel = std::size_t{1} << 50;
  auto against_budget = [&]<class P>(P) -> std::string {
    try {
      run_phantom<P>(model.spec, unbounded, seed.world, schedule, seed.steps, seed.device_budget);
    } catch (const error& e) {
      return e.what();
    }
    return "no error";
  };
  auto unbudgeted = [&]<class P>(P) { return run_phantom<P>(model.spec, unbounded, seed.world, schedule, 2); };
  const phantom_result healthy = unbudgeted(seed_policies{});
  const phantom_result lt = unbudgeted(legacy_tracker_policies{});
  const phantom_result lp = unbudgeted(legacy_prefetch_policies{});
  const phantom_result lr = unbudgeted(legacy_reducer_policies{});
  std::printf(
      "\neach mechanism alone (max_live_numel lifted), per-rank peak with no budget, and what the 80 GiB say:\n");
  std::printf("  %-34s %9s %10s %10s\n", "policies", "peak GiB", "gathered", "buckets");
  auto row = [](const char* name, const phantom_result& r) {
    std::printf("  %-34s %9.3f %10.3f %10.3f\n", name, gib(r.peak()),
                gib(r.peak_step().peak(mem_category::gathered_params)),
                gib(r.peak_step().peak(mem_category::grad_buckets)));
  };
  row("default (zshard)", healthy);
  row("legacy tracker (drifting counts)", lt);
  row("legacy prefetch (reset live count)", lp);
  row("legacy reducer (copied bucket)", lr);
  std::printf("  legacy tracker at 80 GiB:  %s\n", against_budget(legacy_tracker_policies{}).c_str());
  std::printf("  legacy prefetch at 80 GiB: %s\n", against_budget(legacy_prefetch_policies{}).c_str());
  std::printf("  legacy reducer at 80 GiB:  %s\n", against_budget(legacy_reducer_policies{}).c_str());

  std::printf(
      "\nplanning time, chains of small parameters (prefetch window ~4,000 scopes, reuse on, max_live binding):\n"
      "  parameters   plan ms   phantom run of one step ms\n");
  double plan_ms_100k = 0;
  for (std::size_t n : {std::size_t{10'000}, std::size_t{100'000}}) {
    const plan_timing t = plan_time(n);
    std::printf("  %-12zu %-9.1f %.1f\n", n, t.plan_ms, t.run_ms);
    if (n == 100'000) plan_ms_100k = t.plan_ms;
  }

  const int modules = 4000, steps = 20;
  const overhead trace = engine_overhead<default_policies>(modules, steps);
  const overhead on_demand = engine_overhead<on_demand_policies>(modules, steps);
  // reuse on, reaching the whole trace: each scope asks, per parameter, where its next use is
  // (a scan of the trace before the index: quadratic in the number of modules)
  const overhead reuse = engine_overhead<default_policies>(modules, steps, std::size_t{1} << 40);
  trace_sink sink;  // every event and ledger change recorded (engine_config::trace)
  const overhead traced = engine_overhead<default_policies>(modules, steps, 0, &sink);
  std::printf("\nengine bookkeeping (%d modules of 2 parameters, 8 virtual ranks, phantom backend):\n"
              "  prefetcher                 per module scope   step() per parameter\n"
              "  trace (default)            %6.0f ns          %6.0f ns\n"
              "  trace, reuse (any reach)   %6.0f ns          %6.0f ns\n"
              "  on-demand                  %6.0f ns          %6.0f ns\n"
              "  trace, with a trace_sink   %6.0f ns          %6.0f ns\n",
              modules, trace.per_scope_ns, trace.step_per_param_ns, reuse.per_scope_ns, reuse.step_per_param_ns,
              on_demand.per_scope_ns, on_demand.step_per_param_ns, traced.per_scope_ns, traced.step_per_param_ns);

  std::printf("\npeak_gib: %.3f\n", gib(run.peak()));
  std::printf("plan_gib: %.3f\n", gib(plan.device.total_peak));
  std::printf("plan_device_total_gib: %.3f\n", gib(plan.device_total()));
  std::printf("legacy_tracker_peak_gib: %.3f\n", gib(lt.peak()));
  std::printf("legacy_prefetch_peak_gib: %.3f\n", gib(lp.peak()));
  std::printf("legacy_reducer_peak_gib: %.3f\n", gib(lr.peak()));
  std::printf("steps_with_growth: %d\n", run.steps_with_growth());
  std::printf("prefetch_gathers_ahead: %zu\n", run.scopes_with_gathers_ahead);
  std::printf("plan_ms_100k: %.1f\n", plan_ms_100k);
  std::printf("host_state_gib_per_rank: %.3f\n", gib(run.host ? run.host->total_peak() : 0));
  std::printf("scope_overhead_traced_ns: %.0f\n", traced.per_scope_ns);
  std::printf("scope_overhead_ns: %.0f\n", trace.per_scope_ns);
  std::printf("scope_overhead_reuse_ns: %.0f\n", reuse.per_scope_ns);
  return 0;
}

// The seed scenario (plan/seed_scenario.hpp), simulated: Llama-3-70B, 8 ranks, bf16, optimizer
// state on the host, checkpointing per block, 3 steps x 2 micro-batches of 1 x 4096 tokens.
// Questions: what does each rank hold at its peak, by ledger category, and does the planner
// say so before the run? Is the peak flat from step to step? What does the regressed tracker
// (testing::legacy_tracker) do with the same run? And what does the engine's own bookkeeping
// cost per module scope (phantom backend: no math, no copies, no communication)?
//
// Prints tables, then the key figures as `name: value`.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/seed_scenario.hpp"
#include "zshard/prefetch/on_demand.hpp"
#include "zshard/testing/legacy_tracker.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

struct legacy_policies : seed_policies {
  using hook_tracker = testing::legacy_tracker;
};
struct on_demand_policies : default_policies {
  using prefetcher = prefetch::on_demand;
};

double gib(std::size_t bytes) { return double(bytes) / double(std::size_t{1} << 30); }

// Engine time per module scope: `modules` modules of two small parameters each, forward in
// order then backward in reverse (begin/end_backward included: they are per micro-batch).
// step() is timed apart: it runs once per optimizer step, over every parameter.
struct overhead {
  double per_scope_ns = 0;
  double step_per_param_ns = 0;
};
template <class Policies>
overhead engine_overhead(int modules, int steps) {
  model_spec spec;
  for (int i = 0; i < modules; ++i) {
    const std::string n = "m" + std::to_string(i);
    const param_id w = spec.add_param(n + ".w", {64, 64}), b = spec.add_param(n + ".b", {64}, {.decay = false});
    spec.add_module(n, {w, b});
  }
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
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

}  // namespace

int main() {
  const seed_scenario seed;
  const transformer_model model = build_transformer(seed.shape);
  const step_schedule schedule = transformer_schedule(model, seed.activations);
  const engine_config cfg = seed.config();

  std::printf("seed scenario: %s (%.2fe9 parameters), %d ranks, bf16, optimizer on the host, checkpointing,\n"
              "  micro-batch %lld x %lld tokens, %d steps x %d micro-batches, device budget %.0f GiB\n"
              "  max_live_numel 1e9, prefetch_numel 5e7, reduce_bucket_numel 5e8, allow_oversized_module\n\n",
              seed.shape.name.c_str(), double(seed.shape.param_count()) / 1e9, seed.world,
              static_cast<long long>(seed.activations.micro_batch), static_cast<long long>(seed.activations.seq_len),
              seed.steps, seed.activations.micro_batches, gib(seed.device_budget));

  const auto t0 = std::chrono::steady_clock::now();
  const memory_plan plan = plan_memory(model.spec, cfg, seed.world, schedule, seed.options());
  const auto t1 = std::chrono::steady_clock::now();
  const phantom_result run = run_phantom<seed_policies>(model.spec, cfg, seed.world, schedule, seed.steps, seed.device_budget);
  const auto t2 = std::chrono::steady_clock::now();

  std::printf("per-rank peak by category (plan: computed before the run; run: phantom backend)\n");
  print_plan(std::cout, plan, &run.peak_step(), run.host ? &*run.host : nullptr);
  std::printf("\nstep  peak GiB   gathered  buckets   activations\n");
  for (std::size_t s = 0; s < run.steps.size(); ++s) {
    const memory_ledger& l = run.steps[s];
    std::printf("%-5zu %-10.3f %-9.3f %-9.3f %-9.3f\n", s + 1, gib(l.total_peak()), gib(l.peak(mem_category::gathered_params)),
                gib(l.peak(mem_category::grad_buckets)), gib(l.peak(mem_category::activations)));
  }
  std::printf("plan: %.1f ms; phantom run of %d steps: %.1f ms; rank 0 sends %.1f GiB per step\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(), seed.steps,
              std::chrono::duration<double, std::milli>(t2 - t1).count(), gib(run.bytes_sent_per_step));

  // The regressed tracker: within the seed's budgets; with max_live_numel lifted, so that only
  // the 80 GiB of the device stands in its way; and with no budget at all, to see how far it goes.
  auto legacy_error = [&](const engine_config& c, std::optional<std::size_t> budget) -> std::string {
    try {
      run_phantom<legacy_policies>(model.spec, c, seed.world, schedule, seed.steps, budget);
    } catch (const error& e) {
      return e.what();
    }
    return "no error";
  };
  engine_config unbounded = cfg;
  unbounded.prefetch.max_live_numel = std::size_t{1} << 50;
  const phantom_result legacy = run_phantom<legacy_policies>(model.spec, unbounded, seed.world, schedule, seed.steps);
  std::printf("\nlegacy tracker (testing::legacy_tracker), same run:\n");
  std::printf("  seed budgets:              %s\n", legacy_error(cfg, seed.device_budget).c_str());
  std::printf("  max_live_numel lifted:     %s\n", legacy_error(unbounded, seed.device_budget).c_str());
  std::printf("  no budget, peak per step:");
  for (const auto& l : legacy.steps) std::printf(" %.3f GiB", gib(l.total_peak()));
  std::printf(" (gathered_params %.3f GiB: every block held through backward)\n",
              gib(legacy.peak_step().peak(mem_category::gathered_params)));

  const int modules = 4000, steps = 20;
  const overhead trace = engine_overhead<default_policies>(modules, steps);
  const overhead on_demand = engine_overhead<on_demand_policies>(modules, steps);
  std::printf("\nengine bookkeeping (%d modules of 2 parameters, 8 virtual ranks, phantom backend):\n"
              "  prefetcher                 per module scope   step() per parameter\n"
              "  trace (default)            %6.0f ns          %6.0f ns\n"
              "  on-demand                  %6.0f ns          %6.0f ns\n",
              modules, trace.per_scope_ns, trace.step_per_param_ns, on_demand.per_scope_ns, on_demand.step_per_param_ns);

  std::printf("\npeak_gib: %.3f\n", gib(run.peak()));
  std::printf("plan_gib: %.3f\n", gib(plan.device.total_peak));
  std::printf("legacy_peak_gib: %.3f\n", gib(legacy.peak()));
  std::printf("steps_with_growth: %d\n", run.steps_with_growth());
  std::printf("host_state_gib_per_rank: %.3f\n", gib(run.host ? run.host->total_peak() : 0));
  std::printf("scope_overhead_ns: %.0f\n", trace.per_scope_ns);
  return 0;
}

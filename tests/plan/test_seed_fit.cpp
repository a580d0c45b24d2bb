// The seed scenario through zshard_plan --fit's search (issue 43, 5c): Llama-3-70B SFT on one node
// of 8 x 80 GB A100s (2 TiB of host memory: a DGX A100) with DeepSpeed's default budgets, the
// optimizer on the host, 16 micro-batches of 1 x 4096 tokens per step, every block checkpointed.
// The fit reproduces what the seed reports (it fits: the plan is the seed's, 29.872 GiB of ledger
// per rank, bench/NOTES_plans.md), and the configuration it would run instead fits too and is
// predicted no slower.
#include <doctest/doctest.h>

#include "zshard/plan/fit_search.hpp"
#include "../../bench/seed_scenario.hpp"

using namespace zshard;
using namespace zshard::plan;

TEST_CASE("seed: the fit plans the seed's configuration as the seed's plan, and chooses one that fits and is faster") {
  const zshard_bench::seed_scenario seed;
  fit_problem pr;
  pr.model = llama_fit_model(seed.shape, seed.activations.seq_len, dtype::bf16);
  pr.machine = {*gpu_kind_named("a100-80g"), 8, 1};
  CHECK(pr.machine.rates.host_gib == 2048);
  pr.global_batch_tokens = 8 * 1 * 16 * seed.activations.seq_len;
  pr.base = seed.config();
  pr.base.prefetch.allow_oversized_module = false;
  pr.threads = 1;
  const fit_problem p = prepared(pr);

  // the seed's configuration, as the fit sees it
  const fit_candidate deepspeed{{3, fit_optimizer::host, offload_tier::device, 8},
                                50'000'000,
                                1'000'000'000,
                                true,
                                500'000'000,
                                {1, 16, 1}};
  const fit_entry base = evaluate_candidate(p, deepspeed, config_of(deepspeed, seed.config(), p.machine, ""));
  INFO(base.reason);
  REQUIRE(base.outcome == fit_outcome::fits);
  const transformer_model model = seed.model();
  const memory_plan seed_plan =
      plan_memory(model.spec, seed.config(), seed.world, training_schedule{{seed.program(model)}}, seed.options());
  CHECK(base.plan->device.total_peak == seed_plan.device.total_peak);
  CHECK(base.device_total == seed_plan.device_total());
  CHECK(base.host_per_node >= 8 * seed_plan.host.total_peak);  // and the staging halves beside
  CHECK(base.host_per_node > std::size_t{1024} << 30);        // more than 1 TiB: the seed's node had 2

  const fit_result r = fit_search(p);
  const fit_entry* best = r.best();
  REQUIRE(best);
  CHECK(best->device_total <= p.machine.device_bytes());
  CHECK(best->host_per_node <= p.machine.host_bytes_per_node());
  CHECK(best->time.total <= base.time.total);
  MESSAGE("seed: " << base.time.total << " s per step as configured; the fit's choice " << best->time.total << " s ("
                   << describe(best->candidate.family, 8) << ", micro-batch " << best->candidate.step.micro_batch
                   << " x " << best->candidate.step.accumulation << ", "
                   << checkpoint_words(best->candidate.step.checkpoint_every) << "); " << r.planned << " planned");
}

// zshard_plan --fit's search (plan/fit_search.hpp), checked on random models and machines:
//  - the chosen candidate's phantom run (the real engine and Offloader, accounting only) stays
//    within its plan on every tier: every device category, the device total, the host ledger and
//    the NVMe files;
//  - the pruning is exact: every candidate ruled out by a floor (its family's, or the activation
//    floor), planned as it would be, does not fit either; every candidate left unplanned, planned,
//    is either over capacity or no faster than the slowest of the top it was skipped for; and
//    every lower bound is at most its candidate's predicted time;
//  - the ranking is by predicted time and every ranked candidate fits its machine.
// Also: the time model's terms on a case computed by hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <string>

#include "zshard/offload/host_adam.hpp"
#include "zshard/plan/fit_search.hpp"
#include "zshard/plan/phantom_run.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

struct fit_host_policies : default_policies {
  using offloader = offload::host_adam;
};

struct fit_case {
  fit_problem problem;
  std::string text;
};

// A small Llama-style model on a small machine whose capacities sit around what the model
// needs, so that some families fit and some are ruled out by each of the terms.
fit_case random_fit_case(std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  const int heads = 1 << pick(0, 2), kv = heads >> pick(0, 1 < heads ? 1 : 0);
  transformer_shape s{"random", pick(1, 4), 16 * heads * pick(1, 3), 32 * pick(1, 6), heads, std::max(1, kv),
                      pick(20, 400), pick(0, 3) == 0};
  const std::int64_t seq = 8 * pick(1, 8);
  fit_case c;
  fit_problem& pr = c.problem;
  pr.model = llama_fit_model(s, seq, dtype::bf16, pick(0, 1) == 1);
  const char* kinds[] = {"h100-sxm", "a100-80g", "host"};
  pr.machine.rates = *gpu_kind_named(kinds[pick(0, 2)]);
  pr.machine.ranks_per_node = 1 << pick(0, 2);
  pr.machine.nodes = pick(1, 2);
  const int world = pr.machine.world();
  pr.global_batch_tokens = seq * world * (1 << pick(0, 2));
  pr.base.param_dtype = dtype::bf16;
  pr.base.partition.persistence_threshold_numel = std::size_t(pick(0, 1) * 64);
  pr.base.offload.nvme_chunk_numel = 1024;
  pr.base.offload.nvme_buffer_count = 3;
  pr.base.offload.host_staging_numel = std::size_t{1} << 16;
  pr.base.offload.host_tile_numel = 1024;
  pr.base.log = [](const std::string&) {};
  // capacities around what the model needs: bytes of the model's state per rank
  const double state = double(s.param_count()) * 18.0 / world, gib = double(std::size_t{1} << 30);
  const double overhead = pr.machine.rates.device_is_host ? 0.0 : 1.4 * gib;  // cuda_defaults, roughly
  pr.machine.rates.device_gib = (overhead + state * uniform(0.02, 1.5)) / gib;
  pr.machine.rates.host_gib = state * pr.machine.ranks_per_node * uniform(0.05, 2.0) / gib +
                              (pr.machine.rates.device_is_host ? pr.machine.rates.device_gib * world : 0.0);
  pr.machine.rates.nvme_gib = pick(0, 1) ? state * pr.machine.ranks_per_node * uniform(0.1, 3.0) / gib : 0.0;
  // axes: a random subset of each, so that a case stays small
  const fit_problem full = prepared(pr);
  auto subset = [&](auto v) {
    std::shuffle(v.begin(), v.end(), rng);
    v.resize(std::size_t(std::max(1, pick(1, int(std::min<std::size_t>(v.size(), 3))))));
    return v;
  };
  pr.axes = full.axes;
  pr.axes.prefetch_numel = subset(full.axes.prefetch_numel);
  pr.axes.bucket_numel = subset(full.axes.bucket_numel);
  pr.axes.micro_batches = subset(full.axes.micro_batches);
  pr.axes.checkpoint_every = subset(full.axes.checkpoint_every);
  pr.top = pick(1, 4);
  pr.threads = 1;
  std::ostringstream os;
  os << "shape " << s.layers << "x" << s.hidden << " mlp " << s.intermediate << " heads " << s.heads << "/" << s.kv_heads
     << " vocab " << s.vocab << (s.tied_embeddings ? " tied" : "") << " seq " << seq << "; " << pr.machine.rates.kind
     << " " << pr.machine.nodes << "x" << pr.machine.ranks_per_node << " device " << pr.machine.rates.device_gib
     << " GiB host " << pr.machine.rates.host_gib << " nvme " << pr.machine.rates.nvme_gib << "; top " << pr.top;
  c.text = os.str();
  return c;
}

// The chosen candidate, run on the phantom backend: within its plan on every tier.
void check_fit_run_within_plan(const fit_problem& pr, const fit_entry& e) {
  const engine_config cfg = config_of(e.candidate, pr.base, pr.machine, "/nonexistent (phantom runs create no file)");
  const training_schedule schedule = pr.model.schedule(e.candidate.step);
  const memory_plan& plan = *e.plan;
  const int steps = plan.steps_simulated + 1;
  const phantom_result run = e.candidate.family.optimizer == fit_optimizer::device
                                 ? run_phantom(pr.model.spec, cfg, pr.world(), schedule, steps)
                                 : run_phantom<fit_host_policies>(pr.model.spec, cfg, pr.world(), schedule, steps);
  for (const auto& s : run.steps) {
    for (std::size_t c = 0; c < mem_category_count; ++c) {
      INFO(to_string(mem_category(c)));
      CHECK(s.peak(mem_category(c)) <= plan.device.peak[c]);
    }
    CHECK(s.total_peak() <= plan.device.total_peak);
  }
  if (run.host) CHECK(run.host->total_peak() <= plan.host.total_peak);
  if (run.nvme) CHECK(run.nvme->total_peak() <= plan.nvme.total_peak);
  CHECK(zshard::plan::detail::over_capacity(plan, pr.machine).empty());
}

}  // namespace

TEST_CASE("fit: on random models and machines the choice runs within its plan and the pruning is exact") {
  std::mt19937_64 rng(20261206);
  int found = 0, families_out = 0, activation_out = 0, skipped_checked = 0, over = 0;
  for (int i = 0; i < 300; ++i) {
    const fit_case c = random_fit_case(rng);
    INFO("case " << i << ": " << c.text);
    const fit_problem pr = prepared(c.problem);
    const fit_result r = fit_search(pr);
    // the ranking: fitting candidates, fastest first
    for (std::size_t k = 0; k < r.ranking.size(); ++k) {
      const fit_entry& e = r.entries[r.ranking[k]];
      REQUIRE(e.outcome == fit_outcome::fits);
      CHECK(zshard::plan::detail::over_capacity(*e.plan, pr.machine).empty());
      if (k > 0) CHECK(r.entries[r.ranking[k - 1]].time.total <= e.time.total);
    }
    if (const fit_entry* best = r.best()) {
      ++found;
      check_fit_run_within_plan(pr, *best);
    }
    const double kth = r.ranking.size() >= std::size_t(pr.top) ? r.entries[r.ranking[std::size_t(pr.top) - 1]].time.total
                                                                : 1e300;
    // each ruled-out or unplanned candidate (a sample of each kind per case), planned as the search would
    int sampled[6] = {};
    for (const fit_entry& e : r.entries) {
      if (e.plan) {
        CHECK(e.lower_bound.total <= e.time.total * (1 + 1e-12));
        over += e.outcome == fit_outcome::too_big;
        continue;
      }
      if (sampled[int(e.outcome)]++ >= 6) continue;
      const engine_config cfg = config_of(e.candidate, pr.base, pr.machine, pr.nvme_path);
      const fit_entry again = evaluate_candidate(pr, e.candidate, cfg);
      INFO(to_string(e.outcome) << ": " << e.reason << "; planned: " << to_string(again.outcome) << " " << again.reason);
      switch (e.outcome) {
        case fit_outcome::family_floor:
          ++families_out;
          CHECK(again.outcome != fit_outcome::fits);
          break;
        case fit_outcome::activation_floor:
          ++activation_out;
          CHECK(again.outcome != fit_outcome::fits);
          break;
        case fit_outcome::not_planned:
          ++skipped_checked;
          CHECK(e.lower_bound.total <= again.time.total * (1 + 1e-12));
          if (again.outcome == fit_outcome::fits) CHECK(again.time.total >= kth);
          break;
        default:
          FAIL("an entry without a plan is ruled out by a floor or not planned");
      }
    }
  }
  MESSAGE("fit property: " << found << " of 300 cases found a configuration; checked " << families_out
                           << " family-floor, " << activation_out << " activation-floor and " << skipped_checked
                           << " unplanned candidates; " << over << " planned over capacity");
  CHECK(found > 100);
  CHECK(found < 300);  // some machines are too small for anything
  CHECK(families_out > 50);
  CHECK(activation_out > 20);
  CHECK(skipped_checked > 20);
}

TEST_CASE("fit time model: the terms of a hand-computed case") {
  // 2 ranks on one node, no overlap (the host backend): every term adds up
  fit_machine m;
  m.rates = *gpu_kind_named("host");
  m.rates.gemm_tflops = 1e-3;  // 1 GFLOP/s
  m.rates.compute_efficiency = 0.5;
  m.rates.intra_node_gbps = 2;
  m.rates.latency_us = 0;
  m.rates.host_adam_gelems = 0.001;
  m.ranks_per_node = 2;
  step_volume v;
  v.flops = 1e9;             // 2 s at 0.5 GFLOP/s
  v.reduce_bytes = 4'000'000'000;  // 2 s
  v.gather_lb_bytes = 2'000'000'000;
  v.state_numel = 1'000'000;  // 1 s
  fit_candidate c;
  c.family = {3, fit_optimizer::device, offload_tier::device, 2};
  step_bytes b;
  b.shard_group = 10'000'000'000;  // gathers: 10e9 - 4e9 = 6e9 bytes, 3 s
  const engine_config cfg;
  const step_time_terms t = predict_step_time(v, b, c, cfg, m);
  CHECK(t.compute == doctest::Approx(2.0));
  CHECK(t.reduce == doctest::Approx(2.0));
  CHECK(t.gather == doctest::Approx(3.0));
  CHECK(t.optimizer == doctest::Approx(1.0));
  CHECK(t.total == doctest::Approx(8.0));
  CHECK(std::string(t.dominant()) == "gather");
  // a GPU overlaps: gathers hidden to the share the prefetch window covers, reductions but the last bucket
  m.rates.streams = true;
  v.typical_module_numel = 100;
  v.grad_numel_per_micro_batch = 1000;
  c.prefetch_numel = 50;  // h = 0.5
  c.bucket_numel = 250;   // q = 0.25
  const step_time_terms o = predict_step_time(v, b, c, cfg, m);
  // max(2, 0.5·3 + 0.75·2) + 0.5·3 + 0.25·2 + optimizer 1
  CHECK(o.total == doctest::Approx(3.0 + 1.5 + 0.5 + 1.0));
  CHECK(o.exposed == doctest::Approx(3.0 + 2.0 - 2.0));
}

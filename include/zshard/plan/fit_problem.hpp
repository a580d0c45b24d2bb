#pragma once
// What zshard_plan --fit searches (plan/fit_search.hpp): the model, the machine, the global
// batch and the axes of the search, with the defaults for a model and a machine:
//   stages             3 (1 and 2 once the stages land)
//   optimizers         device, host, and NVMe when the machine has drives
//   params             device, and host (GPUs only: on the host backend it is the same memory)
//   shard groups       every divisor of the world that is a whole number of nodes or divides a node
//   prefetch_numel     0, m and 2m, m the 90th percentile of the sharded modules' sizes (the
//                      next module or two gathered ahead); max_live_numel is then the base's, or
//                      the window and two such modules, or the largest module, whichever is more
//   bucket_numel       m and 4m
//   micro_batches      every divisor of the sequences each rank trains on per step
//   checkpoint_every   none, every block, every 2nd and every 4th block (those the model has),
//                      or the model's own choices (fit_model::checkpoint_choices)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/plan/fit_candidate.hpp"
#include "zshard/plan/fit_model.hpp"
#include "zshard/plan/gpu_rates.hpp"

namespace zshard::plan {

// The values of each axis. default_axes() fills them for a model and a machine.
struct fit_axes {
  std::vector<int> stages{3};
  std::vector<fit_optimizer> optimizers;
  std::vector<offload_tier> params;
  std::vector<int> shard_groups;
  std::vector<std::size_t> prefetch_numel;
  std::vector<std::size_t> bucket_numel;
  std::vector<int> micro_batches;      // sequences per micro-batch and rank
  std::vector<int> checkpoint_every;   // 0 none, 1 every block, k every k-th
};

struct fit_problem {
  fit_model model;
  fit_machine machine;
  std::int64_t global_batch_tokens = 0;
  engine_config base;  // dtype, persistence threshold, AdamW, clipping: kept in every candidate
  fit_axes axes;
  std::string nvme_path = "/local_nvme/zshard";  // offload_config::nvme_path of NVMe candidates
  int top = 8;
  bool exhaustive = false;
  int threads = 0;  // planning threads; 0: the hardware's, at most 8

  int world() const noexcept { return machine.world(); }
  // Sequences per rank and step (the global batch split over the ranks).
  std::int64_t sequences_per_rank() const noexcept {
    return model.step_fixed() ? 0 : global_batch_tokens / model.seq_len / world();
  }
};

namespace detail {

inline std::vector<int> divisors(std::int64_t n) {
  std::vector<int> d;
  for (std::int64_t k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(int(k));
  return d;
}

// The largest modules' size, for the budget axes: the 90th percentile and the largest sharded
// module of the model (unpadded), with the base config's persistence threshold.
struct module_sizes {
  std::size_t typical = 0, largest = 0;
};
inline module_sizes sizes_of(const model_spec& spec, const engine_config& base) {
  std::vector<std::size_t> s;
  for (module_id m = 0; m < spec.modules().size(); ++m) {
    std::size_t n = 0;
    for (param_id p : spec.module(m).params)
      if (spec.param(p).numel() > base.partition.persistence_threshold_numel) n += spec.param(p).numel();
    if (n > 0) s.push_back(n);
  }
  if (s.empty()) return {1, 1};
  std::sort(s.begin(), s.end());
  return {s[std::min(s.size() - 1, s.size() * 9 / 10)], s.back()};
}

}  // namespace detail

// The axes of a search for `model` on `machine` (fit_problem::axes when left empty).
inline fit_axes default_axes(const fit_problem& pr) {
  fit_axes a;
  const fit_machine& mc = pr.machine;
  const int world = mc.world();
  a.optimizers = {fit_optimizer::device, fit_optimizer::host};
  if (mc.has_nvme()) a.optimizers.push_back(fit_optimizer::nvme);
  if (!pr.model.optimizer_choices.empty()) {
    a.optimizers.clear();
    for (int o : pr.model.optimizer_choices) a.optimizers.push_back(fit_optimizer(o));
  }
  a.params = {offload_tier::device};
  if (!mc.rates.device_is_host) a.params.push_back(offload_tier::host);
  for (int g : detail::divisors(world))
    if (g <= mc.ranks_per_node ? mc.ranks_per_node % g == 0 : g % mc.ranks_per_node == 0) a.shard_groups.push_back(g);
  const detail::module_sizes ms = detail::sizes_of(pr.model.spec, pr.base);
  a.prefetch_numel = {0, ms.typical, 2 * ms.typical};
  a.bucket_numel = {ms.typical, 4 * ms.typical};
  if (pr.model.step_fixed()) {
    a.micro_batches = {0};
    a.checkpoint_every = {-1};
  } else {
    for (int d : detail::divisors(pr.sequences_per_rank())) a.micro_batches.push_back(d);
    a.checkpoint_every = {0, 1};
    for (int k : {2, 4})
      if (k < pr.model.blocks) a.checkpoint_every.push_back(k);
    if (!pr.model.checkpoint_choices.empty()) a.checkpoint_every = pr.model.checkpoint_choices;
  }
  return a;
}

// Checks the problem and fills empty axes with default_axes().
inline fit_problem prepared(fit_problem pr) {
  ZSHARD_REQUIRE(pr.machine.ranks_per_node >= 1 && pr.machine.nodes >= 1, error_kind::config,
                 "the machine needs at least one rank per node and one node");
  if (!pr.model.step_fixed()) {
    const std::int64_t per_sequence = pr.model.seq_len;
    ZSHARD_REQUIRE(pr.global_batch_tokens >= per_sequence && pr.global_batch_tokens % per_sequence == 0,
                   error_kind::config,
                   "the global batch of " + std::to_string(pr.global_batch_tokens) +
                       " tokens is not a whole number of sequences of " + std::to_string(per_sequence));
    const std::int64_t seqs = pr.global_batch_tokens / per_sequence;
    ZSHARD_REQUIRE(seqs % pr.world() == 0, error_kind::config,
                   "the global batch of " + std::to_string(seqs) + " sequences does not split evenly over " +
                       std::to_string(pr.world()) + " ranks",
                   "give a global batch that is a multiple of ranks x sequence length tokens");
  }
  const fit_axes d = default_axes(pr);
  fit_axes& a = pr.axes;
  if (a.stages.empty()) a.stages = d.stages;
  if (a.optimizers.empty()) a.optimizers = d.optimizers;
  if (a.params.empty()) a.params = d.params;
  if (a.shard_groups.empty()) a.shard_groups = d.shard_groups;
  if (a.prefetch_numel.empty()) a.prefetch_numel = d.prefetch_numel;
  if (a.bucket_numel.empty()) a.bucket_numel = d.bucket_numel;
  if (a.micro_batches.empty()) a.micro_batches = d.micro_batches;
  if (a.checkpoint_every.empty()) a.checkpoint_every = d.checkpoint_every;
  if (pr.top < 1) pr.top = 1;
  return pr;
}

// Families the machine can run at all: parameters on the host only with the optimizer there
// (host_adam updates them), NVMe only when the machine has drives.
inline bool family_possible(const fit_family& f, const fit_machine& m) {
  if (f.params == offload_tier::host && f.optimizer == fit_optimizer::device) return false;
  if (f.optimizer == fit_optimizer::nvme && !m.has_nvme()) return false;
  if (m.world() % f.shard_group != 0) return false;
  return true;
}

}  // namespace zshard::plan

#pragma once
// The scenario zshard starts from (DESIGN.md, "the lesson"): Llama-3-70B trained on 8 ranks
// of 80 GiB, bf16 parameters, optimizer state offloaded to the host, activation checkpointing
// per block, micro-batch 1 x 4096 tokens, with the budgets the regressed Python
// implementation was run with (DeepSpeed's defaults: max live 1e9, prefetch bucket 5e7,
// reduce bucket 5e8, persistence threshold 1e5). The model is at the granularity of DeepSpeed's
// module hooks (build_transformer_hooks: attention projections, MLP projections and norms are
// modules; each block is one checkpointed segment), so the Prefetcher gathers the small K and
// V projections ahead of their use. It ran out of memory there; here its per-rank peak is
// planned before the run, bounded in the run, and flat from step to step. The benches
// (seed_70b, hsdp_70b), the tests (tests/plan) and zshard_plan's defaults use this one
// definition. Not part of the library (a scenario, not an API): the model and the plan it
// uses are (plan/llama_shape.hpp, plan/memory_plan.hpp).
#include <cstddef>

#include "zshard/engine/default_policies.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/memory_plan.hpp"

namespace zshard_bench {

using zshard::default_policies;
using zshard::dtype;
using zshard::engine_config;
using namespace zshard::plan;

// The default policies with the optimizer on the host.
struct seed_policies : default_policies {
  using offloader = zshard::offload::host_adam;
};

struct seed_scenario {
  transformer_shape shape = llama3_70b();
  int world = 8;
  std::size_t device_budget = std::size_t{80} << 30;  // 80 GiB per rank
  int steps = 3;
  activation_options activations{
      .micro_batch = 1, .seq_len = 4096, .checkpoint = true, .activation_type = dtype::bf16, .micro_batches = 2};

  transformer_model model() const { return build_transformer_hooks(shape); }
  step_program program(const transformer_model& m) const { return transformer_hook_program(m, activations); }

  engine_config config() const {
    engine_config c;
    c.param_dtype = dtype::bf16;
    c.partition.persistence_threshold_numel = 100'000;  // norm gains stay replicated
    c.prefetch.max_live_numel = 1'000'000'000;
    c.prefetch.prefetch_numel = 50'000'000;
    // The 70B embedding and LM head are 128256 x 8192 = 1.05e9 elements each, more than
    // max_live_numel: each may be gathered alone while its scope runs (I5's exception).
    c.prefetch.allow_oversized_module = true;
    c.reduce.reduce_bucket_numel = 500'000'000;
    return c;
  }
  // A GPU's own terms (CUDA context, NCCL, pool, workspaces) count in `fits`.
  plan_options options() const {
    return {.optimizer = optimizer_location::host, .overheads = device_overheads::cuda_defaults()};
  }
};

}  // namespace zshard_bench

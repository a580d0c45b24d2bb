#pragma once
// The scenario zshard starts from (DESIGN.md, "the lesson"): Llama-3-70B trained on 8 ranks
// of 80 GiB, bf16 parameters, optimizer state offloaded to the host, activation checkpointing
// per block, micro-batch 1 x 4096 tokens, with the budgets the regressed Python
// implementation was run with. It ran out of memory there; here its per-rank peak is planned
// before the run, bounded in the run, and flat from step to step. Tests (tests/plan) and the
// bench (bench/seed_70b) use this one definition.
#include <cstddef>

#include "zshard/engine/default_policies.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/memory_plan.hpp"

namespace zshard::plan {

// The default policies with the optimizer on the host.
struct seed_policies : default_policies {
  using offloader = offload::host_adam;
};

struct seed_scenario {
  transformer_shape shape = llama3_70b();
  int world = 8;
  std::size_t device_budget = std::size_t{80} << 30;  // 80 GiB per rank
  int steps = 3;
  activation_options activations{.micro_batch = 1, .seq_len = 4096, .checkpoint = true,
                                 .activation_type = dtype::bf16, .micro_batches = 2};

  engine_config config() const {
    engine_config c;
    c.param_dtype = dtype::bf16;
    c.prefetch.max_live_numel = 1'000'000'000;
    c.prefetch.prefetch_numel = 50'000'000;
    // The 70B embedding and LM head are 128256 x 8192 = 1.05e9 elements each, more than
    // max_live_numel: each may be gathered alone while its scope runs (I5's exception).
    c.prefetch.allow_oversized_module = true;
    c.reduce.reduce_bucket_numel = 500'000'000;
    return c;
  }
  plan_options options() const { return {.optimizer = optimizer_location::host}; }
};

}  // namespace zshard::plan

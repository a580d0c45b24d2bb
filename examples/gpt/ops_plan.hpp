#pragma once
// What a run of the backend-generic GPT is, before it runs: its options, the engine settings it
// uses, its model FLOPs per token and its memory plan (the schedule recorded from the same
// runner, ops_runner.hpp). Plain C++: the GPU runs (cuda/gpu_gpt.hpp) and the CPU tests share it.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ops_runner.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/schedule_recorder.hpp"
#include "zshard/prefetch/pass_trace_prefetcher.hpp"

namespace gpt {

// One prefetch trace per kind of pass (training, evaluation), as the host example.
struct gpu_policies : zshard::default_policies {
  using prefetcher = zshard::prefetch::pass_trace;
};

struct gpu_run_options {
  gpt_config model;
  int batch = 8;         // sequences per rank per step
  int steps = 20;
  bool checkpoint = true;
  float lr = 3e-4f;
  double clip = 1.0;
  std::uint64_t seed = 1234;
  int eval_every = 0;    // a no-grad evaluation pass every N steps (0: never)
  bool read_loss = true;  // read the loss every step (a host wait); the bench reads it at the end
};

// Model FLOPs per token, the PaLM convention: 6 x (parameters in matmuls) + 12 x layers x d x T
// for attention, counted in full although the fused attention skips the key tiles above the
// diagonal (about half of them), as MFU figures are usually quoted. Embedding lookups are not
// matmuls and are not counted.
inline double flops_per_token(const gpt_config& c, int seq) {
  const double d = c.d_model, f = c.d_ff, v = c.vocab;
  const double matmul_params = c.n_layers * (d * 3 * d + d * d + 2 * d * f) + d * v;
  return 6.0 * matmul_params + 12.0 * c.n_layers * d * seq;
}

inline zshard::engine_config engine_config_for(const gpu_run_options& o) {
  zshard::engine_config cfg;
  cfg.param_dtype = zshard::dtype::bf16;  // the model's matmul operands
  cfg.partition.persistence_threshold_numel = std::size_t(4) * std::size_t(o.model.d_model);  // biases, gains
  cfg.reduce.reduce_bucket_numel = 25'000'000;
  cfg.adamw.lr = o.lr;
  cfg.adamw.weight_decay = 0.1f;
  cfg.clip_norm = o.clip;
  return cfg;
}

// The device plan for this run: the runner's schedule recorded on the phantom backend (three
// steps; the evaluation pass after the second's step() when there is one), planned with `overheads`
// (device_overheads::cuda_defaults() on a GPU). Ops: the one the run computes with (its half
// type sizes the arena).
template <class Ops>
zshard::plan::memory_plan plan_for(const zshard_model& model, const zshard::engine_config& cfg, int world,
                                   const gpu_run_options& o,
                                   zshard::plan::device_overheads overheads = zshard::plan::device_overheads::cuda_defaults()) {
  const std::size_t arena = ops_gpt<Ops>::arena_bytes(model.config, o.batch, model.config.seq_len, o.checkpoint);
  const batch none{};  // the recorder computes nothing
  const auto schedule = zshard::plan::record_schedule<gpu_policies>(
      model.spec, cfg, world,
      [&](auto& rec, int s) {
        ops_engine_runner<std::remove_reference_t<decltype(rec)>, Ops> r(rec, model, nullptr, arena, o.checkpoint);
        if (o.eval_every > 0 && s == 2) r.evaluate(none);  // the run's evaluation after step 2's step()
        r.train_micro_batch(none);
        rec.step();
      },
      3);
  return zshard::plan::plan_memory(model.spec, cfg, world, schedule, {.overheads = overheads});
}

}  // namespace gpt

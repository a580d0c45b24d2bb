#pragma once
// The main job's model (examples/02_train_gpt: the GPT example on the host backend) as a fit
// model (plan/fit_model.hpp): its model_spec, the step its runner (examples/gpt/zshard_gpt.hpp)
// drives the engine through, with the activation bytes it reports, and its FLOPs. zshard_plan
// --fit --model gpt-example and bench/fit_calibration use it.
//
// The runner reports every activation it keeps at the end of forward and 0 at the end of
// backward; with checkpointing it keeps each block's input and one shared block cache, without
// it one cache per block (its caches are f32 whatever the parameters' dtype). As 02_train_gpt's
// own plan does, the bytes are charged from the first module's forward to its backward.
// FLOPs per token of a forward: a block's four linear layers 2·(3d² + d² + 2·d·f), plus causal
// attention 2·T·d (QK^T and the weighted sum over T/2 positions on average); the head 2·d·V; the
// embedding and the loss 0.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpt/gpt_model.hpp"
#include "gpt/zshard_spec.hpp"
#include "zshard/plan/fit_candidate.hpp"
#include "zshard/plan/fit_model.hpp"
#include "zshard/plan/step_schedule.hpp"

namespace zshard_tools {

// The model 02_train_gpt trains by default (its train_options).
inline gpt::gpt_config main_job_model() {
  return {.vocab = 64, .seq_len = 64, .d_model = 128, .n_heads = 4, .n_layers = 4, .d_ff = 512};
}

// Bytes the runner keeps between forward and backward for `batch` sequences.
inline std::size_t gpt_activation_bytes(const gpt::gpt_config& c, int batch, bool checkpoint) {
  const std::size_t n = std::size_t(batch) * std::size_t(c.seq_len), d = std::size_t(c.d_model),
                    v = std::size_t(c.vocab);
  const std::size_t caches = checkpoint ? 1 : std::size_t(c.n_layers);
  return n * sizeof(std::int32_t)                                            // embed: token ids
         + (std::size_t(c.n_layers) + 1) * n * d * sizeof(float)            // block inputs, head input
         + caches * gpt::block_activation_bytes<float>(c, batch, c.seq_len)  // block caches
         + (n * d + n) * sizeof(float)                                       // head: xhat, rstd
         + n * v * sizeof(float) + n * sizeof(std::int32_t)                  // loss: probs, targets
         + n * v * sizeof(float);                                            // logits
}

inline zshard::plan::fit_model gpt_fit_model(const gpt::gpt_config& c, std::uint64_t seed = 1234) {
  auto zm = std::make_shared<const gpt::zshard_model>(gpt::make_zshard_model(c, seed));
  zshard::plan::fit_model m;
  m.name = "gpt-example";
  m.spec = zm->spec;
  m.seq_len = c.seq_len;
  m.blocks = c.n_layers;
  m.main_job = true;
  m.checkpoint_choices = {0, 1};  // the runner checkpoints every block or none
  // 02_train_gpt keeps offload::on_device (on the host backend the device's memory is the host's)
  m.optimizer_choices = {int(zshard::plan::fit_optimizer::device)};
  const double d = c.d_model, f = c.d_ff, t = c.seq_len, v = c.vocab;
  m.forward_flops_per_token.assign(zm->spec.modules().size(), 0.0);
  for (auto b : zm->blocks) m.forward_flops_per_token[b] = 2 * (3 * d * d + d * d + 2 * d * f) + 2 * t * d;
  m.forward_flops_per_token[zm->head] = 2 * d * v;
  m.program = [zm, c](const zshard::plan::fit_step_shape& s) {
    const bool checkpoint = s.checkpoint_every > 0;
    zshard::plan::step_schedule sch;
    sch.micro_batches = s.accumulation;
    sch.modules.push_back({.module = zm->embed, .kept_bytes = gpt_activation_bytes(c, s.micro_batch, checkpoint)});
    for (auto b : zm->blocks) sch.modules.push_back({.module = b, .recomputed = checkpoint});
    sch.modules.push_back({.module = zm->head});
    return zshard::plan::to_program(sch);
  };
  return m;
}

}  // namespace zshard_tools

#pragma once
// The model a fit searches for (plan/fit_search.hpp): its model_spec, how one optimizer step
// looks for a micro-batch size, an accumulation and a checkpointing choice (a step program,
// plan/schedule.hpp), and the FLOPs of each module's forward per token, which the time model
// turns into compute time (plan/fit_time_model.hpp). Two kinds come with the library:
//  - a Llama-style shape (plan/llama_shape.hpp), at DeepSpeed's hook granularity or one module
//    per block, every micro-batch size and checkpointing choice (none, every block, every k-th);
//  - a schedule file's model and training schedule (plan/schedule_file.hpp): its step is given,
//    so only the stage, tiers, shard group and budgets are searched.
// A training stack describes its own model the same way (a spec, a program function, FLOPs).
//
// FLOPs per token of a module's forward: 2 per parameter element it multiplies (a dense layer),
// except an embedding (a lookup: 0) and attention, which adds 4·s·h per layer (QK^T and the
// weighted sum of V, s the sequence length, h the hidden size; the usual 6N + 12·L·h·s per token
// of Kaplan et al. 2020 and PaLM's MFU accounting, fwd + bwd). A backward costs twice its
// forward; a recompute costs a forward again.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/schedule.hpp"

namespace zshard::plan {

// One step's shape: `micro_batch` sequences per micro-batch and rank, `accumulation` micro-batches
// per optimizer step, checkpointing every `checkpoint_every`-th block (0: none, 1: every block).
struct fit_step_shape {
  int micro_batch = 1;
  int accumulation = 1;
  int checkpoint_every = 1;
  bool operator==(const fit_step_shape&) const = default;
};

struct fit_model {
  std::string name;
  model_spec spec;
  std::int64_t seq_len = 0;  // tokens per sequence
  int blocks = 0;            // checkpointable blocks (0: the step is fixed, a schedule file's)
  std::vector<double> forward_flops_per_token;  // per module, one use's forward
  std::function<step_program(const fit_step_shape&)> program;
  // A schedule file: its cycle is the step (the search varies no step shape), and the tokens
  // each micro-batch of it trains on each rank.
  std::optional<training_schedule> fixed{};
  std::int64_t fixed_tokens_per_micro_batch = 0;
  // The checkpointing choices the training stack offers (checkpoint_every values); empty: none,
  // every block, every 2nd and every 4th block.
  std::vector<int> checkpoint_choices{};
  // Where the training stack can keep the optimizer state (plan/fit_candidate.hpp); empty: the
  // device, the host and NVMe (when the machine has drives).
  std::vector<int> optimizer_choices{};  // fit_optimizer values
  // The main job's model (examples/02_train_gpt): the fit prints its command line.
  bool main_job = false;

  bool step_fixed() const noexcept { return fixed.has_value(); }
  training_schedule schedule(const fit_step_shape& s) const {
    if (fixed) return *fixed;
    return training_schedule{{program(s)}};
  }
  std::size_t param_count() const { return spec.total_numel(); }
  // Tokens one micro-batch trains on, per rank.
  std::int64_t tokens_per_micro_batch(const fit_step_shape& s) const {
    return fixed ? fixed_tokens_per_micro_batch : std::int64_t(s.micro_batch) * seq_len;
  }
};

// Forward FLOPs per token of every module: 2 per element of its parameters (each counted once
// per module even when shared), embeddings 0.
inline std::vector<double> dense_flops_per_token(const model_spec& spec, const std::vector<module_id>& embeddings = {}) {
  std::vector<double> f(spec.modules().size(), 0.0);
  for (module_id m = 0; m < spec.modules().size(); ++m) {
    double n = 0;
    for (param_id p : spec.module(m).params) n += double(spec.param(p).numel());
    f[m] = 2 * n;
  }
  for (module_id e : embeddings) f[e] = 0;
  return f;
}

// A Llama-style shape; `hooks`: DeepSpeed's hook granularity (plan/llama_shape.hpp).
inline fit_model llama_fit_model(const transformer_shape& shape, std::int64_t seq_len, dtype activation_type,
                                 bool hooks = true) {
  auto tm = std::make_shared<const transformer_model>(hooks ? build_transformer_hooks(shape)
                                                            : build_transformer(shape));
  fit_model m;
  m.name = shape.name;
  m.spec = tm->spec;
  m.seq_len = seq_len;
  m.blocks = shape.layers;
  m.forward_flops_per_token = dense_flops_per_token(tm->spec, {tm->embed});
  const double attention = 4.0 * double(seq_len) * double(shape.hidden);
  for (int l = 0; l < shape.layers; ++l) {
    // with hooks, attention sits between the projections: counted with the output projection
    const module_id at = hooks ? tm->block_parts[std::size_t(l)][4] : tm->blocks[std::size_t(l)];
    m.forward_flops_per_token[at] += attention;
  }
  m.program = [tm, seq_len, activation_type, hooks](const fit_step_shape& s) {
    const activation_options o{.micro_batch = s.micro_batch,
                               .seq_len = seq_len,
                               .checkpoint = s.checkpoint_every > 0,
                               .activation_type = activation_type,
                               .micro_batches = s.accumulation,
                               .checkpoint_every = s.checkpoint_every > 0 ? s.checkpoint_every : 1};
    return hooks ? transformer_hook_program(*tm, o) : to_program(transformer_schedule(*tm, o));
  };
  return m;
}

// A given model and schedule (a schedule file's), each micro-batch training on
// `tokens_per_micro_batch` tokens per rank; FLOPs: dense_flops_per_token.
inline fit_model schedule_fit_model(std::string name, const model_spec& spec, const training_schedule& schedule,
                                    std::int64_t tokens_per_micro_batch) {
  schedule.validate(spec);
  ZSHARD_REQUIRE(tokens_per_micro_batch >= 1, error_kind::config,
                 "a schedule's micro-batch must train on at least one token per rank");
  fit_model m;
  m.name = std::move(name);
  m.spec = spec;
  m.seq_len = tokens_per_micro_batch;
  m.forward_flops_per_token = dense_flops_per_token(spec);
  m.fixed = schedule;
  m.fixed_tokens_per_micro_batch = tokens_per_micro_batch;
  return m;
}

// Micro-batches per step in a schedule's first program (end_backward calls).
inline int micro_batches_of(const step_program& p) {
  int n = 0;
  for (const auto& e : p.events) n += e.kind == event_kind::end_backward;
  return n;
}

}  // namespace zshard::plan

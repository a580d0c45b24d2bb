#pragma once
// Llama-style decoder shapes as zshard models, and the activation model the memory planner
// and the phantom scenario share. Only shapes: no weights, no math. A shape becomes a
// model_spec with one module per execution unit (embed, block0..blockN-1, head), which is
// the granularity at which the engine gathers and reduces.
//
// Activation model (bytes a training stack holds; `e` = bytes per activation element, 2 in
// 16-bit; s = sequence length, b = micro-batch, h = hidden, V = vocabulary):
//  - A transformer layer keeps 34·s·b·h bytes in 16-bit for its backward: Korthikanti et al.
//    2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198),
//    Sec. 4.1, sbh(34 + 5as/h) per layer, of which the 5as/h term (attention scores, softmax,
//    dropout mask) is never materialised with flash attention. We use 17·s·b·h·e, i.e. the
//    same count of 16-bit-equivalent tensors scaled to the activation dtype. It is a GPT-3
//    shaped estimate; SwiGLU and grouped-query attention shift it by tens of percent, which
//    moves a checkpointed plan by a few percent (only one layer is materialised at a time).
//  - Checkpointed layer: its input, s·b·h·e, is kept from forward until its backward; the
//    rest, (17·s·b·h − s·b·h)·e, is re-materialised by the recompute right before backward.
//  - Embedding: the token ids, s·b·4 (int32). Head: the final norm's input and output,
//    2·s·b·h·e, and the logits, s·b·V·4 (f32; the loss overwrites them with its gradient).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/step_schedule.hpp"

namespace zshard::plan {

struct transformer_shape {
  std::string name;
  int layers = 0;
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;  // MLP (SwiGLU) width
  int heads = 0;
  int kv_heads = 0;  // grouped-query attention: K and V have kv_heads heads
  std::int64_t vocab = 0;
  bool tied_embeddings = false;  // the head reuses the embedding matrix

  std::int64_t head_dim() const noexcept { return heads > 0 ? hidden / heads : 0; }
  std::int64_t kv_dim() const noexcept { return kv_heads * head_dim(); }

  std::int64_t block_numel() const noexcept {
    return 2 * hidden * hidden + 2 * hidden * kv_dim() + 3 * hidden * intermediate + 2 * hidden;
  }
  std::int64_t param_count() const noexcept {
    return layers * block_numel() + vocab * hidden * (tied_embeddings ? 1 : 2) + hidden;
  }

  void validate() const {
    const std::string who = "transformer shape '" + name + "': ";
    ZSHARD_REQUIRE(layers >= 1 && hidden >= 1 && intermediate >= 1 && vocab >= 1, error_kind::config,
                   who + "layers, hidden, intermediate and vocab must be positive");
    ZSHARD_REQUIRE(heads >= 1 && hidden % heads == 0, error_kind::config, who + "hidden must be a multiple of heads");
    ZSHARD_REQUIRE(kv_heads >= 1 && heads % kv_heads == 0, error_kind::config,
                   who + "heads must be a multiple of kv_heads");
  }
};

inline transformer_shape llama3_8b() { return {"llama3-8b", 32, 4096, 14336, 32, 8, 128256, false}; }
inline transformer_shape llama3_70b() { return {"llama3-70b", 80, 8192, 28672, 64, 8, 128256, false}; }
// A 13B-class Llama (Llama 2 13B's shape: 40 layers, hidden 5120, full multi-head attention).
inline transformer_shape llama2_13b() { return {"llama2-13b", 40, 5120, 13824, 40, 40, 32000, false}; }

// "llama3-8b" / "llama3-70b" / "llama2-13b" (or with '_' for '-'); nullopt for other names.
inline std::optional<transformer_shape> transformer_shape_named(std::string_view name) {
  for (auto s : {llama3_8b(), llama3_70b(), llama2_13b()}) {
    std::string underscored = s.name;
    for (char& c : underscored)
      if (c == '-') c = '_';
    if (name == s.name || name == underscored) return s;
  }
  return std::nullopt;
}

struct transformer_model {
  transformer_shape shape;
  model_spec spec;
  module_id embed = 0, head = 0;
  std::vector<module_id> blocks;                    // one module per block (build_transformer)
  std::vector<std::vector<module_id>> block_parts;  // a block's modules in order (build_transformer_hooks)
};

// Modules in execution order: "embed" [vocab, hidden]; "block<i>" with attn_norm [h], q [h, h],
// k and v [h, kv·hd], o [h, h], mlp_norm [h], gate and up [h, inter], down [inter, h]; "head"
// with the final norm [h] and lm_head [h, vocab] (or the embedding again, when tied). Norm gains
// get no weight decay. Dtypes are left to engine_config::param_dtype.
inline transformer_model build_transformer(const transformer_shape& shape) {
  shape.validate();
  transformer_model m{shape, {}, 0, 0, {}};
  const std::int64_t h = shape.hidden, kv = shape.kv_dim(), f = shape.intermediate;
  const param_options no_decay{.decay = false};
  const param_id embed_w = m.spec.add_param("embed.weight", {shape.vocab, h});
  m.embed = m.spec.add_module("embed", {embed_w});
  for (int l = 0; l < shape.layers; ++l) {
    const std::string b = "block" + std::to_string(l);
    std::vector<param_id> ps;
    ps.push_back(m.spec.add_param(b + ".attn_norm", {h}, no_decay));
    ps.push_back(m.spec.add_param(b + ".q", {h, h}));
    ps.push_back(m.spec.add_param(b + ".k", {h, kv}));
    ps.push_back(m.spec.add_param(b + ".v", {h, kv}));
    ps.push_back(m.spec.add_param(b + ".o", {h, h}));
    ps.push_back(m.spec.add_param(b + ".mlp_norm", {h}, no_decay));
    ps.push_back(m.spec.add_param(b + ".gate", {h, f}));
    ps.push_back(m.spec.add_param(b + ".up", {h, f}));
    ps.push_back(m.spec.add_param(b + ".down", {f, h}));
    m.blocks.push_back(m.spec.add_module(b, std::move(ps)));
  }
  const param_id norm = m.spec.add_param("head.norm", {h}, no_decay);
  const param_id out = shape.tied_embeddings ? embed_w : m.spec.add_param("head.weight", {h, shape.vocab});
  m.head = m.spec.add_module("head", {norm, out});
  return m;
}

// The same shapes at the granularity of DeepSpeed's module hooks, as PyTorch users train them:
// every block is nine modules, "block<i>.attn_norm", ".q", ".k", ".v", ".o", ".mlp_norm",
// ".gate", ".up", ".down", each with its one parameter (named as in build_transformer), so
// the Prefetcher sees the small K and V projections it can gather ahead of their use.
inline transformer_model build_transformer_hooks(const transformer_shape& shape) {
  shape.validate();
  transformer_model m{shape, {}, 0, 0, {}, {}};
  const std::int64_t h = shape.hidden, kv = shape.kv_dim(), f = shape.intermediate;
  const param_options no_decay{.type = std::nullopt, .trainable = true, .decay = false, .init = {}};
  const param_id embed_w = m.spec.add_param("embed.weight", {shape.vocab, h});
  m.embed = m.spec.add_module("embed", {embed_w});
  for (int l = 0; l < shape.layers; ++l) {
    const std::string b = "block" + std::to_string(l);
    std::vector<module_id> parts;
    auto part = [&](const char* name, zshard::shape s, param_options o = {}) {
      parts.push_back(m.spec.add_module(b + "." + name, {m.spec.add_param(b + "." + name, s, std::move(o))}));
    };
    part("attn_norm", {h}, no_decay);
    part("q", {h, h});
    part("k", {h, kv});
    part("v", {h, kv});
    part("o", {h, h});
    part("mlp_norm", {h}, no_decay);
    part("gate", {h, f});
    part("up", {h, f});
    part("down", {f, h});
    m.block_parts.push_back(std::move(parts));
  }
  const param_id norm = m.spec.add_param("head.norm", {h}, no_decay);
  const param_id out = shape.tied_embeddings ? embed_w : m.spec.add_param("head.weight", {h, shape.vocab});
  m.head = m.spec.add_module("head", {norm, out});
  return m;
}

struct activation_options {
  std::int64_t micro_batch = 1;  // sequences per micro-batch (b)
  std::int64_t seq_len = 4096;   // tokens per sequence (s)
  bool checkpoint = true;        // activation checkpointing per block
  dtype activation_type = dtype::bf16;
  int micro_batches = 1;  // per optimizer step (gradient accumulation)
  // With checkpointing on, block l is checkpointed when l % checkpoint_every == 0 (1: every
  // block; 2: every other block, the rest keep their activations and are not recomputed).
  int checkpoint_every = 1;

  bool checkpointed(int block) const noexcept { return checkpoint && block % checkpoint_every == 0; }
};

inline void check_activation_options(const activation_options& o) {
  ZSHARD_REQUIRE(o.micro_batch >= 1 && o.seq_len >= 1, error_kind::config,
                 "micro-batch and sequence length must be positive");
  ZSHARD_REQUIRE(o.checkpoint_every >= 1, error_kind::config,
                 "checkpoint_every must be at least 1 (every block), got " + std::to_string(o.checkpoint_every));
}

// Activation bytes of one layer for its backward: 17·s·b·h·e (34·s·b·h in 16-bit; see above).
inline std::size_t layer_activation_bytes(const transformer_shape& shape, const activation_options& o) {
  return 17 * std::size_t(o.seq_len) * std::size_t(o.micro_batch) * std::size_t(shape.hidden) *
         size_of(o.activation_type);
}

// The schedule of a step with the activation model above.
inline step_schedule transformer_schedule(const transformer_model& m, const activation_options& o) {
  check_activation_options(o);
  const std::size_t tokens = std::size_t(o.seq_len) * std::size_t(o.micro_batch);
  const std::size_t hidden_act = tokens * std::size_t(m.shape.hidden) * size_of(o.activation_type);
  const std::size_t layer = layer_activation_bytes(m.shape, o);
  step_schedule s;
  s.micro_batches = o.micro_batches;
  s.modules.push_back({m.embed, tokens * 4, 0, false});
  for (std::size_t l = 0; l < m.blocks.size(); ++l) {
    const module_id b = m.blocks[l];
    if (o.checkpointed(int(l)))
      s.modules.push_back({b, hidden_act, layer - hidden_act, true});
    else
      s.modules.push_back({b, layer, 0, false});
  }
  s.modules.push_back({m.head, 2 * hidden_act + tokens * std::size_t(m.shape.vocab) * 4, 0, false});
  return s;
}

// The step of a model from build_transformer_hooks, same activation model: each block a
// segment of its nine modules, checkpointed as a whole (recomputed together before its
// backward, as DeepSpeed's activation checkpointing does per block).
inline step_program transformer_hook_program(const transformer_model& m, const activation_options& o) {
  check_activation_options(o);
  ZSHARD_REQUIRE(!m.block_parts.empty(), error_kind::config,
                 "transformer_hook_program needs a model from build_transformer_hooks");
  const std::size_t tokens = std::size_t(o.seq_len) * std::size_t(o.micro_batch);
  const std::size_t hidden_act = tokens * std::size_t(m.shape.hidden) * size_of(o.activation_type);
  const std::size_t layer = layer_activation_bytes(m.shape, o);
  std::vector<segment> segs{{{m.embed}, tokens * 4, 0, false, std::nullopt}};
  for (std::size_t l = 0; l < m.block_parts.size(); ++l) {
    const auto& parts = m.block_parts[l];
    if (o.checkpointed(int(l)))
      segs.push_back({parts, hidden_act, layer - hidden_act, true, std::nullopt});
    else
      segs.push_back({parts, layer, 0, false, std::nullopt});
  }
  segs.push_back({{m.head}, 2 * hidden_act + tokens * std::size_t(m.shape.vocab) * 4, 0, false, std::nullopt});
  return training_step(segs, o.micro_batches);
}

}  // namespace zshard::plan

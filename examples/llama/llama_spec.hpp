#pragma once
// The Llama as zshard sees it: one module per execution unit, as zshard_plan's Llama shape
// (plan/llama_shape.hpp) has them and with its names: "embed" (embed.weight [V, d]), "block<i>"
// (attn_norm [d], q [H hd, d], k and v [KV hd, d], o [d, H hd], mlp_norm [d], gate and up [f, d],
// down [d, f]) and "head" (head.norm [d], head.weight [V, d]; with tie_word_embeddings the head
// lists embed.weight instead, one parameter used by two modules). Weights keep torch's (out, in)
// layout, so a Hugging Face checkpoint maps onto the model by name alone
// (checkpoint/hf_names.hpp's llama_hf_names()). A fresh model is initialised as transformers
// initialises one: weights normal with the config's initializer_range, norm gains 1 (values
// from gpt::init_value, a function of the element index: the same for every world size).
// Norm gains get no weight decay.
#include <cstdint>
#include <string>
#include <vector>

#include "../gpt/gpt_config.hpp"
#include "zshard/checkpoint/hf_config.hpp"
#include "zshard/model/model_spec.hpp"

namespace llama {

using config = zshard::checkpoint::hf_llama_config;

// Parameter indices within each module (the k of P::param(k)).
namespace embed_param {
enum : int { token, count };
}
namespace block_param {
enum : int { attn_norm, q, k, v, o, mlp_norm, gate, up, down, count };
}
namespace head_param {
enum : int { norm, weight, count };
}

struct zshard_model {
  config cfg;
  zshard::model_spec spec;
  zshard::module_id embed = 0, head = 0;
  std::vector<zshard::module_id> blocks;
};

inline zshard_model make_zshard_model(const config& c, std::uint64_t seed) {
  zshard_model m{c, zshard::model_spec("llama"), 0, 0, {}};
  const std::int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size, v = c.vocab_size;
  const auto add = [&](std::string name, std::vector<std::int64_t> shape, bool norm) {
    gpt::param_desc p{std::move(name), shape, !norm, norm ? gpt::init_rule::ones : gpt::init_rule::normal,
                      norm ? 0.0 : c.initializer_range, false};
    const std::uint64_t name_hash = gpt::hash_string(p.name);
    const zshard::shape s = shape.size() == 1 ? zshard::shape{shape[0]} : zshard::shape{shape[0], shape[1]};
    return m.spec.add_param(p.name, s,
                            {.decay = p.decay,
                             .init = [p, name_hash, seed](std::int64_t i) { return gpt::init_value(p, name_hash, i, seed); }});
  };
  const zshard::param_id token = add("embed.weight", {v, d}, false);
  m.embed = m.spec.add_module("embed", {token});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string b = "block" + std::to_string(l) + ".";
    std::vector<zshard::param_id> ps{add(b + "attn_norm", {d}, true), add(b + "q", {q, d}, false),
                                     add(b + "k", {kv, d}, false),      add(b + "v", {kv, d}, false),
                                     add(b + "o", {d, q}, false),       add(b + "mlp_norm", {d}, true),
                                     add(b + "gate", {f, d}, false),    add(b + "up", {f, d}, false),
                                     add(b + "down", {d, f}, false)};
    m.blocks.push_back(m.spec.add_module("block" + std::to_string(l), ps));
  }
  const zshard::param_id norm = add("head.norm", {d}, true);
  m.head = m.spec.add_module("head", {norm, c.tie_word_embeddings ? token : add("head.weight", {v, d}, false)});
  return m;
}

}  // namespace llama

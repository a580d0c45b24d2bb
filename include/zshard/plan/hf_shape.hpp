#pragma once
// The planner's Llama shape (llama_shape.hpp) of a Hugging Face Llama config.json
// (checkpoint/hf_config.hpp): what zshard_plan --hf-config plans. The planner's shape derives
// the head size as hidden / heads; a config whose head_dim differs is refused by name.
#include <string>

#include "zshard/checkpoint/hf_config.hpp"
#include "zshard/plan/llama_shape.hpp"

namespace zshard::plan {

inline transformer_shape transformer_shape_of(const checkpoint::hf_llama_config& c, std::string name) {
  ZSHARD_REQUIRE(c.head_dim * c.num_attention_heads == c.hidden_size, error_kind::config,
                 name + ": head_dim " + std::to_string(c.head_dim) + " x num_attention_heads " +
                     std::to_string(c.num_attention_heads) + " is not hidden_size " + std::to_string(c.hidden_size),
                 "the planner's Llama shape has heads of hidden_size / num_attention_heads");
  transformer_shape s{std::move(name), c.num_hidden_layers, c.hidden_size,  c.intermediate_size,
                      c.num_attention_heads, c.num_key_value_heads, c.vocab_size, c.tie_word_embeddings};
  s.validate();
  return s;
}

// `path`: a config.json, or a checkpoint directory holding one.
inline transformer_shape transformer_shape_from_hf_config(const std::string& path) {
  return transformer_shape_of(checkpoint::read_hf_llama_config(path), path);
}

}  // namespace zshard::plan

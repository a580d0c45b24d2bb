#pragma once
// The table between a model's parameter names and the names of a Hugging Face checkpoint.
// Each row is a pair of patterns in which `{i}` stands for a layer number (digits), e.g.
//   block{i}.q   <->   model.layers.{i}.self_attn.q_proj.weight
// so one row covers every layer. Rows are tried in order; the first whose pattern matches the
// whole name maps it. A name no row matches has no counterpart (an error where one is needed).
// `ignored` lists file names a checkpoint may carry that no parameter takes (older Llama
// checkpoints store each layer's rotary_emb.inv_freq, which is computed, not learnt).
//
// llama_hf_names() is the table of zshard's Llama (examples/llama) and zshard_plan's Llama shape
// (plan/llama_shape.hpp); a user extends it with add() (a fine-tune's extra parameter, a
// checkpoint written under a prefix), or builds a table of their own.
#include <optional>
#include <string>
#include <vector>

namespace zshard::checkpoint {

class hf_name_table {
 public:
  struct row {
    std::string model;  // pattern of the model's name
    std::string file;   // pattern of the checkpoint's name
  };

  hf_name_table& add(std::string model_pattern, std::string file_pattern) {
    rows_.push_back({std::move(model_pattern), std::move(file_pattern)});
    return *this;
  }
  hf_name_table& ignore(std::string file_pattern) {
    ignored_.push_back(std::move(file_pattern));
    return *this;
  }

  // The checkpoint's name for model name `name`, or none.
  std::optional<std::string> to_file(const std::string& name) const {
    for (const auto& r : rows_)
      if (auto i = match(r.model, name)) return fill(r.file, *i);
    return std::nullopt;
  }
  // The model's name for checkpoint name `name`, or none.
  std::optional<std::string> to_model(const std::string& name) const {
    for (const auto& r : rows_)
      if (auto i = match(r.file, name)) return fill(r.model, *i);
    return std::nullopt;
  }
  bool is_ignored(const std::string& file_name) const {
    for (const auto& p : ignored_)
      if (match(p, file_name)) return true;
    return false;
  }

  const std::vector<row>& rows() const noexcept { return rows_; }
  const std::vector<std::string>& ignored() const noexcept { return ignored_; }

  // `name` against `pattern`: the digits `{i}` stands for ("" when the pattern has none), or
  // none when it does not match.
  static std::optional<std::string> match(const std::string& pattern, const std::string& name) {
    const auto at = pattern.find("{i}");
    if (at == std::string::npos) return pattern == name ? std::optional<std::string>("") : std::nullopt;
    const std::string head = pattern.substr(0, at), tail = pattern.substr(at + 3);
    if (name.size() < head.size() + tail.size() + 1 || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
      return std::nullopt;
    const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
    for (char c : digits)
      if (c < '0' || c > '9') return std::nullopt;
    if (digits.size() > 1 && digits[0] == '0') return std::nullopt;  // "01" is not a layer number
    return digits;
  }

 private:
  static std::string fill(const std::string& pattern, const std::string& i) {
    const auto at = pattern.find("{i}");
    return at == std::string::npos ? pattern : pattern.substr(0, at) + i + pattern.substr(at + 3);
  }

  std::vector<row> rows_;
  std::vector<std::string> ignored_;
};

// zshard's Llama names and transformers' LlamaForCausalLM names. Weights keep torch's
// (out, in) layout in both, so a name is all that changes. With tie_word_embeddings the model
// has no head.weight and the checkpoint no lm_head.weight.
inline hf_name_table llama_hf_names() {
  hf_name_table t;
  t.add("embed.weight", "model.embed_tokens.weight")
      .add("block{i}.attn_norm", "model.layers.{i}.input_layernorm.weight")
      .add("block{i}.q", "model.layers.{i}.self_attn.q_proj.weight")
      .add("block{i}.k", "model.layers.{i}.self_attn.k_proj.weight")
      .add("block{i}.v", "model.layers.{i}.self_attn.v_proj.weight")
      .add("block{i}.o", "model.layers.{i}.self_attn.o_proj.weight")
      .add("block{i}.mlp_norm", "model.layers.{i}.post_attention_layernorm.weight")
      .add("block{i}.gate", "model.layers.{i}.mlp.gate_proj.weight")
      .add("block{i}.up", "model.layers.{i}.mlp.up_proj.weight")
      .add("block{i}.down", "model.layers.{i}.mlp.down_proj.weight")
      .add("head.norm", "model.norm.weight")
      .add("head.weight", "lm_head.weight")
      .ignore("model.layers.{i}.self_attn.rotary_emb.inv_freq");
  return t;
}

}  // namespace zshard::checkpoint

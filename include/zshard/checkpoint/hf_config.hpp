#pragma once
// A Hugging Face Llama's config.json: the shape and the numerics a Llama needs from it
// (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, vocab_size, rms_norm_eps, rope_theta and its scaling,
// tie_word_embeddings), read from either spelling transformers writes: v4's top-level
// `rope_theta` / `rope_scaling` and `torch_dtype`, or v5's `rope_parameters` and `dtype`.
// Everything a Llama of zshard cannot compute the way transformers does is refused by name
// (another model_type, biases in the attention or MLP, another activation, a RoPE type other
// than default and llama3): a run that silently ignored one would train a different model.
//
// to_json() gives the file back with the dtype a checkpoint is written in, every key it held
// kept, so an export carries the user's config unchanged otherwise (hf_export.hpp).
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zshard/checkpoint/file_io.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

// Llama 3.1's frequency-dependent RoPE scaling (transformers' rope_type "llama3").
struct hf_llama3_rope {
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

struct hf_llama_config {
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0, initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool llama3_rope = false;
  hf_llama3_rope llama3{};
  std::string dtype_name;  // "bfloat16", "float32", ... as the file says (empty when absent)
  nlohmann::json raw = nlohmann::json::object();  // the whole file, for to_json()

  int kv_dim() const noexcept { return num_key_value_heads * head_dim; }
  int q_dim() const noexcept { return num_attention_heads * head_dim; }

  // RoPE's inverse frequencies, head_dim / 2 of them, as transformers computes them in f32:
  // 1 / theta^(2i / head_dim), then llama3's scaling when the config asks for it.
  std::vector<float> inv_freq() const {
    std::vector<float> f(static_cast<std::size_t>(head_dim / 2));
    for (std::size_t i = 0; i < f.size(); ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
      f[i] = 1.0f / static_cast<float>(std::pow(rope_theta, static_cast<double>(e)));
    }
    if (!llama3_rope) return f;
    const double pi = 3.14159265358979323846;
    const double low_wavelen = llama3.original_max_position_embeddings / llama3.low_freq_factor;
    const double high_wavelen = llama3.original_max_position_embeddings / llama3.high_freq_factor;
    for (float& x : f) {
      const double wavelen = 2 * pi / x;
      if (wavelen < high_wavelen) continue;  // high frequencies: unchanged
      if (wavelen > low_wavelen) {           // low frequencies: divided by the factor
        x = static_cast<float>(x / llama3.factor);
        continue;
      }
      const double smooth = (llama3.original_max_position_embeddings / wavelen - llama3.low_freq_factor) /
                            (llama3.high_freq_factor - llama3.low_freq_factor);
      x = static_cast<float>((1 - smooth) * x / llama3.factor + smooth * x);
    }
    return f;
  }

  // The file again, with "dtype" (and "torch_dtype" where the file used that key) set to
  // the dtype the weights are written in.
  nlohmann::json to_json(dtype weights) const {
    nlohmann::json j = raw;
    const char* name = weights == dtype::bf16 ? "bfloat16" : weights == dtype::f16 ? "float16" : "float32";
    if (j.contains("torch_dtype")) j["torch_dtype"] = name;
    j["dtype"] = name;
    return j;
  }
};

namespace detail {
[[noreturn]] inline void bad_config(const std::string& path, const std::string& what) {
  throw error(error_kind::config, "'" + path + "': " + what,
              "a Llama's config.json as transformers writes it (model_type \"llama\")");
}

inline int config_int(const nlohmann::json& j, const std::string& path, const char* key, bool required, int fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) bad_config(path, std::string("no \"") + key + "\"");
    return fallback;
  }
  if (!j[key].is_number_integer() || j[key].get<std::int64_t>() < 1 || j[key].get<std::int64_t>() > (1 << 30))
    bad_config(path, std::string("\"") + key + "\" is " + j[key].dump() + ", not a positive whole number");
  return j[key].get<int>();
}

inline double config_real(const nlohmann::json& j, const std::string& path, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number() || !std::isfinite(j[key].get<double>()) || j[key].get<double>() <= 0)
    bad_config(path, std::string("\"") + key + "\" is " + j[key].dump() + ", not a positive number");
  return j[key].get<double>();
}

inline bool config_flag(const nlohmann::json& j, const std::string& path, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) bad_config(path, std::string("\"") + key + "\" is " + j[key].dump() + ", not true/false");
  return j[key].get<bool>();
}
}  // namespace detail

// The config of the text `text` (named `path` in messages).
inline hf_llama_config parse_hf_llama_config(const std::string& text, const std::string& path) {
  using detail::bad_config;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) bad_config(path, "not a JSON object");
  const std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (type != "llama")
    bad_config(path, "model_type is " + (type.empty() ? std::string("missing") : "\"" + type + "\"") +
                         ": zshard's Llama reads Llama configs (model_type \"llama\") only");
  hf_llama_config c;
  c.raw = j;
  c.vocab_size = detail::config_int(j, path, "vocab_size", true, 0);
  c.hidden_size = detail::config_int(j, path, "hidden_size", true, 0);
  c.intermediate_size = detail::config_int(j, path, "intermediate_size", true, 0);
  c.num_hidden_layers = detail::config_int(j, path, "num_hidden_layers", true, 0);
  c.num_attention_heads = detail::config_int(j, path, "num_attention_heads", true, 0);
  c.num_key_value_heads = detail::config_int(j, path, "num_key_value_heads", false, c.num_attention_heads);
  c.head_dim = detail::config_int(j, path, "head_dim", false, c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = detail::config_int(j, path, "max_position_embeddings", false, 2048);
  c.rms_norm_eps = detail::config_real(j, path, "rms_norm_eps", 1e-6);
  c.initializer_range = detail::config_real(j, path, "initializer_range", 0.02);
  c.tie_word_embeddings = detail::config_flag(j, path, "tie_word_embeddings", false);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    bad_config(path, "num_attention_heads " + std::to_string(c.num_attention_heads) +
                         " is not a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads));
  if (c.head_dim % 2 != 0) bad_config(path, "head_dim " + std::to_string(c.head_dim) + " is odd (RoPE rotates pairs)");
  if (detail::config_flag(j, path, "attention_bias", false) || detail::config_flag(j, path, "mlp_bias", false))
    bad_config(path, "attention_bias / mlp_bias is true: zshard's Llama has no biases");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    bad_config(path, "hidden_act is " + j["hidden_act"].dump() + ": zshard's Llama computes SwiGLU with silu");
  for (const char* k : {"dtype", "torch_dtype"})
    if (c.dtype_name.empty() && j.contains(k) && j[k].is_string()) c.dtype_name = j[k].get<std::string>();

  // RoPE: transformers v5 writes rope_parameters {rope_type, rope_theta, ...}; v4 wrote
  // rope_theta and rope_scaling {rope_type (or type), factor, ...} at the top level.
  nlohmann::json rope = nlohmann::json::object();
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rope = j["rope_scaling"];
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rope = j["rope_parameters"];
  if (j.contains("rope_theta")) c.rope_theta = detail::config_real(j, path, "rope_theta", 10000.0);
  if (rope.contains("rope_theta")) c.rope_theta = detail::config_real(rope, path, "rope_theta", c.rope_theta);
  std::string rope_type = "default";
  for (const char* k : {"type", "rope_type"})
    if (rope.contains(k) && rope[k].is_string()) rope_type = rope[k].get<std::string>();
  if (rope_type == "llama3") {
    c.llama3_rope = true;
    c.llama3.factor = detail::config_real(rope, path, "factor", 8.0);
    c.llama3.low_freq_factor = detail::config_real(rope, path, "low_freq_factor", 1.0);
    c.llama3.high_freq_factor = detail::config_real(rope, path, "high_freq_factor", 4.0);
    c.llama3.original_max_position_embeddings =
        detail::config_real(rope, path, "original_max_position_embeddings", 8192.0);
    if (c.llama3.high_freq_factor <= c.llama3.low_freq_factor)
      bad_config(path, "llama3 RoPE: high_freq_factor must exceed low_freq_factor");
  } else if (rope_type != "default") {
    bad_config(path, "RoPE type \"" + rope_type + "\": zshard's Llama computes \"default\" and \"llama3\" only");
  }
  return c;
}

// `path`: a config.json, or a directory holding one.
inline hf_llama_config read_hf_llama_config(const std::string& path) {
  std::error_code ec;
  const bool dir = std::filesystem::is_directory(path, ec);
  const std::string file = dir ? path + "/config.json" : path;
  if (!std::filesystem::exists(file, ec))
    throw error(error_kind::io,
                dir ? "'" + path + "' holds no config.json" : "no config file '" + path + "'",
                "name a Hugging Face checkpoint directory (config.json and model.safetensors or "
                "model.safetensors.index.json with its shards), or a Llama config.json");
  return parse_hf_llama_config(read_small_file(file, std::size_t{1} << 20), file);
}

}  // namespace zshard::checkpoint

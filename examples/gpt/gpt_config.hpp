#pragma once
// The GPT example's shape: its configuration, the list of modules and parameters the
// engine shards (in forward order), and a per-element initialisation rule. Nothing here
// depends on Eigen or on zshard, so the trainer can build its engine spec from describe()
// before any math runs.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "hash.hpp"

namespace gpt {

struct gpt_config {
  int vocab = 64;  // the synthetic corpus's vocabulary; 256 for byte-level text
  int seq_len = 64;
  int d_model = 64;
  int n_heads = 4;
  int n_layers = 2;
  int d_ff = 256;

  int head_dim() const noexcept { return n_heads > 0 ? d_model / n_heads : 0; }

  void validate() const {
    auto positive = [](int v, const char* name) {
      if (v < 1)
        throw std::invalid_argument(std::string("gpt_config: ") + name + " must be >= 1, got " +
                                    std::to_string(v));
    };
    positive(seq_len, "seq_len");
    positive(d_model, "d_model");
    positive(n_heads, "n_heads");
    positive(n_layers, "n_layers");
    positive(d_ff, "d_ff");
    if (vocab < 2)
      throw std::invalid_argument("gpt_config: vocab must be >= 2, got " + std::to_string(vocab));
    if (d_model % n_heads != 0)
      throw std::invalid_argument("gpt_config: d_model (" + std::to_string(d_model) +
                                  ") must be divisible by n_heads (" + std::to_string(n_heads) +
                                  ")");
  }
};

// How a parameter starts. Weights are normal-ish with init_std; the residual projections'
// std is already scaled by 1/sqrt(2*n_layers) in describe() (GPT-2), so the residual
// stream's variance does not grow with depth.
enum class init_rule { normal, ones, zeros };

struct param_desc {
  std::string name;            // globally unique, "<module>.<param>", e.g. "block0.attn.qkv.weight"
  std::vector<int64_t> shape;  // row-major
  bool decay = true;           // false for biases and layer-norm gains/biases (AdamW skips them)
  init_rule init = init_rule::normal;
  double init_std = 0.0;
  // A linear layer's weight, kept as (in, out) for y = x W: files (export, --init-from) hold
  // torch's (out, in) (zshard's param_options::file_transposed).
  bool linear = false;

  int64_t numel() const noexcept {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

struct module_desc {
  std::string name;  // "embed", "block<i>", "head", "loss"
  std::vector<param_desc> params;

  int64_t numel() const noexcept {
    int64_t n = 0;
    for (const auto& p : params) n += p.numel();
    return n;
  }
};

// Parameter indices within each module's params list (the k of P::param(k)).
namespace embed_param {
enum : int { token, position, count };
}
namespace block_param {
enum : int {
  ln1_gain,
  ln1_bias,
  qkv_weight,
  qkv_bias,
  attn_proj_weight,
  attn_proj_bias,
  ln2_gain,
  ln2_bias,
  fc_weight,
  fc_bias,
  mlp_proj_weight,
  mlp_proj_bias,
  count
};
}
namespace head_param {
enum : int { ln_gain, ln_bias, weight, count };
}

// Module indices in describe()'s order.
inline int embed_module() noexcept { return 0; }
inline int block_module(int layer) noexcept { return 1 + layer; }
inline int head_module(const gpt_config& c) noexcept { return 1 + c.n_layers; }
inline int loss_module(const gpt_config& c) noexcept { return 2 + c.n_layers; }

inline std::vector<module_desc> describe(const gpt_config& c) {
  c.validate();
  constexpr double weight_std = 0.02;
  const double residual_std = weight_std / std::sqrt(2.0 * c.n_layers);
  const int64_t d = c.d_model, f = c.d_ff, v = c.vocab, t = c.seq_len;

  auto weight = [](std::string n, std::vector<int64_t> s, double std_dev) {
    return param_desc{std::move(n), std::move(s), true, init_rule::normal, std_dev, false};
  };
  auto linear = [](std::string n, int64_t in, int64_t out, double std_dev) {
    return param_desc{std::move(n), {in, out}, true, init_rule::normal, std_dev, true};
  };
  auto bias = [](std::string n, int64_t size) {
    return param_desc{std::move(n), {size}, false, init_rule::zeros, 0.0, false};
  };
  auto gain = [](std::string n, int64_t size) {
    return param_desc{std::move(n), {size}, false, init_rule::ones, 0.0, false};
  };

  std::vector<module_desc> out;
  out.push_back(
      {"embed",
       {weight("embed.token", {v, d}, weight_std), weight("embed.position", {t, d}, weight_std)}});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string m = "block" + std::to_string(l);
    out.push_back(
        {m,
         {gain(m + ".ln1.gain", d), bias(m + ".ln1.bias", d),
          linear(m + ".attn.qkv.weight", d, 3 * d, weight_std), bias(m + ".attn.qkv.bias", 3 * d),
          linear(m + ".attn.proj.weight", d, d, residual_std), bias(m + ".attn.proj.bias", d),
          gain(m + ".ln2.gain", d), bias(m + ".ln2.bias", d),
          linear(m + ".mlp.fc.weight", d, f, weight_std), bias(m + ".mlp.fc.bias", f),
          linear(m + ".mlp.proj.weight", f, d, residual_std), bias(m + ".mlp.proj.bias", d)}});
  }
  // The LM head is untied from the token embedding so every parameter has one owner module.
  out.push_back({"head",
                 {gain("head.ln.gain", d), bias("head.ln.bias", d),
                  linear("head.weight", d, v, weight_std)}});
  out.push_back({"loss", {}});
  return out;
}

// Initial value of element `index` of parameter `p`: a pure function of (seed, p.name, index),
// so any shard can initialise its slice alone and get the bits the full model would have.
// name_hash: hash_string(p.name), which a caller filling many elements computes once.
inline float init_value(const param_desc& p, uint64_t name_hash, int64_t index, uint64_t seed) {
  if (index < 0 || index >= p.numel())
    throw std::out_of_range("init_value: index " + std::to_string(index) + " outside " + p.name +
                            " (numel " + std::to_string(p.numel()) + ")");
  switch (p.init) {
    case init_rule::zeros:
      return 0.0f;
    case init_rule::ones:
      return 1.0f;
    case init_rule::normal:
      break;
  }
  const uint64_t h = hash_combine(hash_combine(seed, name_hash), static_cast<uint64_t>(index));
  // Irwin-Hall: four 16-bit uniforms summed, centred and scaled to unit variance. Normal
  // enough for init, bounded (|z| < 3.47), and exact arithmetic (no libm), so the bits are
  // identical on every platform.
  double s = 0.0;
  for (int j = 0; j < 4; ++j) s += (static_cast<double>((h >> (16 * j)) & 0xffffU) + 0.5) / 65536.0;
  constexpr double sqrt3 = 1.7320508075688772;
  return static_cast<float>((s - 2.0) * sqrt3 * p.init_std);
}
inline float init_value(const param_desc& p, int64_t index, uint64_t seed) {
  return init_value(p, hash_string(p.name), index, seed);
}

}  // namespace gpt

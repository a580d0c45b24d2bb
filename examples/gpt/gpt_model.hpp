#pragma once
// The GPT example's model: include this one header. It brings the configuration and
// parameter list (gpt_config.hpp), the layers (gpt_layers.hpp) and the modules
// (gpt_modules.hpp), and adds plain_params / plain_model, a parameter store that owns its
// values and gradients, and a whole-model forward/backward over it: the single-process
// reference the sharded trainer is compared with, and what the tests train.
#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "gpt_config.hpp"
#include "gpt_layers.hpp"
#include "gpt_modules.hpp"

namespace gpt {

// One module's parameters and gradients, each a contiguous row-major vector.
template <class S>
struct plain_params {
  std::vector<std::vector<S>> values;
  std::vector<std::vector<S>> grads;

  plain_params() = default;
  // Initialised with init_value, so equal to what any sharded engine builds from the seed.
  plain_params(const module_desc& m, uint64_t seed) {
    for (const auto& p : m.params) {
      const int64_t n = p.numel();
      auto& v = values.emplace_back(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        v[static_cast<std::size_t>(i)] = static_cast<S>(init_value(p, i, seed));
      grads.emplace_back(static_cast<std::size_t>(n), S(0));
    }
  }

  const S* param(int k) const { return values.at(static_cast<std::size_t>(k)).data(); }
  S* grad(int k) { return grads.at(static_cast<std::size_t>(k)).data(); }

  void zero_grad() {
    for (auto& g : grads) std::fill(g.begin(), g.end(), S(0));
  }
};

static_assert(param_writer<plain_params<float>, float>);
static_assert(param_writer<plain_params<double>, double>);

// All modules' parameters in describe() order (the loss module has none).
template <class S>
struct plain_model {
  gpt_config config;
  std::vector<module_desc> desc;
  std::vector<plain_params<S>> modules;

  plain_model(const gpt_config& c, uint64_t seed) : config(c), desc(describe(c)) {
    modules.reserve(desc.size());
    for (const auto& m : desc) modules.emplace_back(m, seed);
  }

  plain_params<S>& embed() { return modules[static_cast<std::size_t>(embed_module())]; }
  plain_params<S>& block(int layer) {
    return modules.at(static_cast<std::size_t>(block_module(layer)));
  }
  plain_params<S>& head() { return modules[static_cast<std::size_t>(head_module(config))]; }
  const plain_params<S>& embed() const { return modules[static_cast<std::size_t>(embed_module())]; }
  const plain_params<S>& block(int layer) const {
    return modules.at(static_cast<std::size_t>(block_module(layer)));
  }
  const plain_params<S>& head() const {
    return modules[static_cast<std::size_t>(head_module(config))];
  }

  void zero_grad() {
    for (auto& m : modules) m.zero_grad();
  }
};

// Everything the whole-model pass keeps between calls (sized on first use, then reused).
// Without checkpointing each block keeps its own cache; acts[i] is block i's input and
// acts[n_layers] the head's.
template <class S>
struct model_workspace {
  embed_cache<S> embed;
  std::vector<block_cache<S>> blocks;
  head_cache<S> head;
  cross_entropy_cache<S> loss;
  std::vector<mat<S>> acts;
  mat<S> logits, grad_a, grad_b;

  std::size_t saved_bytes() const noexcept {
    std::size_t n = embed.saved_bytes() + head.saved_bytes() + loss.saved_bytes();
    for (const auto& b : blocks) n += b.saved_bytes();
    for (const auto& a : acts) n += detail::bytes_of(a);
    return n + detail::bytes_of(logits);
  }
};

namespace detail {
template <class S>
void check_tokens(std::span<const int32_t> tokens, std::span<const int32_t> targets, int batch,
                  int seq) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq);
  require(tokens.size() == n && targets.size() == n,
          "gpt model: tokens/targets must both hold B*T = " + std::to_string(n) + " entries");
}
}  // namespace detail

// Mean next-token loss; fills the workspace's caches (so a backward could follow).
template <class S>
double forward_loss(const plain_model<S>& m, std::span<const int32_t> tokens,
                    std::span<const int32_t> targets, int batch, int seq, model_workspace<S>& ws) {
  const gpt_config& c = m.config;
  detail::check_tokens<S>(tokens, targets, batch, seq);
  const auto layers = static_cast<std::size_t>(c.n_layers);
  ws.blocks.resize(layers);
  ws.acts.resize(layers + 1);
  embed_forward(c, m.embed(), tokens, batch, seq, ws.embed, ws.acts[0]);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto i = static_cast<std::size_t>(l);
    block_forward(c, m.block(l), ws.acts[i], batch, seq, ws.blocks[i], ws.acts[i + 1]);
  }
  head_forward(c, m.head(), ws.acts[layers], ws.head, ws.logits);
  return cross_entropy_forward<S>(ws.logits, targets, ws.loss);
}

// Forward and backward: ADDS scale * d(mean loss)/d(param) to m's gradients, returns the loss.
template <class S>
double forward_backward(plain_model<S>& m, std::span<const int32_t> tokens,
                        std::span<const int32_t> targets, int batch, int seq,
                        model_workspace<S>& ws, std::type_identity_t<S> scale = S(1)) {
  const double loss = forward_loss(m, tokens, targets, batch, seq, ws);
  const gpt_config& c = m.config;
  cross_entropy_backward(ws.loss, ws.grad_a, scale);
  head_backward(c, m.head(), ws.head, ws.grad_a, ws.grad_b);
  for (int l = c.n_layers - 1; l >= 0; --l)
    block_backward(c, m.block(l), ws.blocks[static_cast<std::size_t>(l)], ws.grad_b, ws.grad_b);
  embed_backward(c, m.embed(), ws.embed, ws.grad_b);
  return loss;
}

}  // namespace gpt

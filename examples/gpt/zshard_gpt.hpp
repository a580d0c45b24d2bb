#pragma once
// The GPT example on zshard: registers the model's modules and parameters with a model_spec,
// and runs micro-batches through an engine's scopes, with activation checkpointing per block
// as a switch. Shared by the example trainer and the tests that check the engine on it.
#include <cstdint>
#include <string>
#include <vector>

#include "gpt_model.hpp"
#include "step_profile.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard_spec.hpp"

namespace gpt {

// Presents an engine scope as the model's parameter interface. f32 parameters are read in
// place; bf16/f16 ones are widened once per scope into reusable float buffers (the host
// math is f32). Gradients are always the engine's f32 buffers.
template <class Scope>
class scope_params {
 public:
  scope_params(const Scope& scope, std::vector<std::vector<float>>& widened) : scope_(scope) {
    const std::size_t n = scope.param_count();
    ptrs_.resize(n);
    if (widened.size() < n) widened.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const zshard::const_view v = scope.param(k);
      if (v.type() == zshard::dtype::f32) {
        ptrs_[k] = static_cast<const float*>(v.data());
      } else {
        widened[k].resize(v.numel());
        zshard::convert(v.data(), v.type(), widened[k].data(), zshard::dtype::f32, v.numel());
        ptrs_[k] = widened[k].data();
      }
    }
  }
  const float* param(int k) const { return ptrs_[static_cast<std::size_t>(k)]; }
  float* grad(int k) { return scope_.grad_data(static_cast<std::size_t>(k)); }

 private:
  const Scope& scope_;
  std::vector<const float*> ptrs_;
};

// Runs micro-batches of the GPT through an engine. With checkpointing, only each block's
// input is kept from forward; backward re-runs the block's forward (engine.recompute: gathers
// but is not counted) into one shared cache right before its backward.
template <class Engine>
class zshard_gpt_runner {
 public:
  zshard_gpt_runner(Engine& eng, const zshard_model& model, bool checkpoint)
      : eng_(eng), m_(model), c_(model.config), checkpoint_(checkpoint) {
    caches_.resize(checkpoint ? 1 : static_cast<std::size_t>(c_.n_layers));
    acts_.resize(static_cast<std::size_t>(c_.n_layers) + 1);
  }

  // Adds the time spent in the model's own math (layers, loss) to *seconds from now on; null
  // stops it (step_profile.hpp).
  void time_compute_into(double* seconds) noexcept { compute_ = seconds; }

  // Forward and backward of one micro-batch; returns its mean loss. Gradients accumulate in
  // the engine until step().
  double train_micro_batch(const batch& b) {
    const double loss = forward(b, zshard::use_kind::counted);
    {
      profile_timer t(compute_);
      cross_entropy_backward(ce_, logits_, eng_.loss_scale());  // dlogits overwrite the logits
    }
    eng_.begin_backward();
    {
      auto g = eng_.backward(m_.head);
      profile_timer t(compute_);
      head_backward(c_, scope_params(g, widened_), head_cache_, logits_, dy_);
    }
    for (int l = c_.n_layers; l-- > 0;) {
      const auto i = static_cast<std::size_t>(l);
      block_cache<float>& cache = checkpoint_ ? caches_[0] : caches_[i];
      if (checkpoint_) {
        auto r = eng_.recompute(m_.blocks[i]);
        profile_timer t(compute_);
        block_forward(c_, scope_params(r, widened_), acts_[i], b.batch_size, b.seq_len, cache, scratch_y_);
      }
      auto g = eng_.backward(m_.blocks[i]);
      profile_timer t(compute_);
      block_backward(c_, scope_params(g, widened_), cache, dy_, dy_);
    }
    {
      auto g = eng_.backward(m_.embed);
      profile_timer t(compute_);
      embed_backward(c_, scope_params(g, widened_), embed_cache_, dy_);
    }
    eng_.end_backward();
    eng_.report_activations(0);
    return loss;
  }

  // A no-grad pass (evaluation): gathers, never counts, nothing waits for a backward.
  double evaluate(const batch& b) {
    const double loss = forward(b, zshard::use_kind::no_grad);
    eng_.report_activations(0);
    return loss;
  }

  // Bytes of activations this runner keeps between forward and backward right now.
  std::size_t activation_bytes() const {
    std::size_t n = embed_cache_.saved_bytes() + head_cache_.saved_bytes() + ce_.saved_bytes();
    for (const auto& c : caches_) n += c.saved_bytes();
    for (const auto& a : acts_) n += static_cast<std::size_t>(a.size()) * sizeof(float);
    n += static_cast<std::size_t>(logits_.size()) * sizeof(float);
    return n;
  }

 private:
  double forward(const batch& b, zshard::use_kind kind) {
    {
      auto g = eng_.forward(m_.embed, kind);
      profile_timer t(compute_);
      embed_forward(c_, scope_params(g, widened_), b.tokens, b.batch_size, b.seq_len, embed_cache_, acts_[0]);
    }
    for (int l = 0; l < c_.n_layers; ++l) {
      const auto i = static_cast<std::size_t>(l);
      auto g = eng_.forward(m_.blocks[i], kind);
      profile_timer t(compute_);
      block_forward(c_, scope_params(g, widened_), acts_[i], b.batch_size, b.seq_len,
                    checkpoint_ ? caches_[0] : caches_[i], acts_[i + 1]);
    }
    {
      auto g = eng_.forward(m_.head, kind);
      profile_timer t(compute_);
      head_forward(c_, scope_params(g, widened_), acts_.back(), head_cache_, logits_);
    }
    double loss = 0;
    {
      profile_timer t(compute_);
      loss = cross_entropy_forward<float>(logits_, b.targets, ce_);
    }
    eng_.report_activations(activation_bytes());
    return loss;
  }

  Engine& eng_;
  const zshard_model& m_;
  const gpt_config& c_;
  bool checkpoint_;
  embed_cache<float> embed_cache_;
  std::vector<block_cache<float>> caches_;
  head_cache<float> head_cache_;
  cross_entropy_cache<float> ce_;
  std::vector<mat<float>> acts_;  // acts_[l]: input of block l; acts_.back(): input of the head
  mat<float> logits_, dy_, scratch_y_;  // dy_: the gradient flowing backward
  std::vector<std::vector<float>> widened_;
  double* compute_ = nullptr;
};

}  // namespace gpt

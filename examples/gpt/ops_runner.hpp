#pragma once
// Running the backend-generic GPT (ops_model.hpp) two ways:
//   ops_engine_runner  through a zshard engine: each module's parameters come from its scope
//                      (gathered for the scope's life), gradients go into the scope's buffers,
//                      activation checkpointing per block and no-grad evaluation as
//                      zshard_gpt_runner does on the host. Generic over the engine: against the
//                      schedule recorder (plan/schedule_recorder.hpp) it opens the same scopes
//                      and reports the same activation bytes without computing anything, so the
//                      planner sees the run's schedule. Generic over the model too: any with
//                      embed / blocks / head modules and ops_gpt's calls (the Llama,
//                      examples/llama/llama_model.hpp, runs through it); a model with
//                      loss_denominator() says what its loss is a mean over (else B x T).
//   plain_trainer      without zshard: every parameter resident (working copy, f32 master,
//                      AdamW moments, f32 gradient), the same global-norm clipping and the same
//                      backend AdamW kernel: the baseline the engine is measured against.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops_model.hpp"
#include "zshard_spec.hpp"
#include "zshard/model/use_kind.hpp"
#include "zshard/backend/backend.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/tensor_view.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/grad_clip.hpp"

namespace gpt {

template <class H>
inline constexpr zshard::dtype half_dtype = zshard::dtype_of<H>;

// An engine scope as the model's parameter access: param(k) in place (the engine's working
// dtype must be the model's half type), grad(k) the scope's f32 buffer.
template <class Scope, class H>
class scope_ptrs {
 public:
  explicit scope_ptrs(const Scope& s) : s_(s) {}
  const H* param(int k) const {
    const zshard::const_view v = s_.param(std::size_t(k));
    if (v.type() != half_dtype<H>)
      throw std::invalid_argument("ops GPT: parameter #" + std::to_string(k) + " is " +
                                  std::string(zshard::to_string(v.type())) + ", the model computes with " +
                                  std::string(zshard::to_string(half_dtype<H>)) +
                                  " operands (set engine_config::param_dtype to match)");
    return static_cast<const H*>(v.data());
  }
  float* grad(int k) { return s_.grad_data(std::size_t(k)); }

 private:
  const Scope& s_;
};

template <class Engine, class Ops, class Model = ops_gpt<Ops>, class Ids = zshard_model>
class ops_engine_runner {
 public:
  using half_t = typename Ops::half_t;
  static constexpr bool computes = Engine::backend_type::holds_storage;

  // model: null only when the engine records a schedule (nothing is computed).
  ops_engine_runner(Engine& eng, const Ids& ids, Model* model, std::size_t activation_bytes, bool checkpoint)
      : eng_(eng), ids_(ids), model_(model), activation_bytes_(activation_bytes), checkpoint_(checkpoint) {}

  // Forward and backward of one micro-batch; gradients accumulate in the engine until step().
  void train_micro_batch(const batch& b) {
    if constexpr (computes) model_->load_batch(b);
    float grad_weight = 0.0f;  // d(loss_scale x mean loss) / d(row loss)
    if constexpr (computes) {
      if constexpr (requires { model_->loss_denominator(); })
        grad_weight = eng_.loss_scale() / model_->loss_denominator();
      else
        grad_weight = eng_.loss_scale() / float(std::size_t(b.batch_size) * b.seq_len);
    }
    forward(zshard::use_kind::counted, grad_weight);
    eng_.begin_backward();
    with(eng_.backward(ids_.head), [&](auto& p) { model_->head_backward(p); });
    for (int l = layers(); l-- > 0;) {
      const auto m = ids_.blocks[std::size_t(l)];
      if (checkpoint_) with(eng_.recompute(m), [&](auto& p) { model_->block_forward(l, p); });
      with(eng_.backward(m), [&](auto& p) { model_->block_backward(l, p); });
    }
    with(eng_.backward(ids_.embed), [&](auto& p) { model_->embed_backward(p); });
    eng_.end_backward();
  }

  // A no-grad pass: gathers, never counts.
  void evaluate(const batch& b) {
    if constexpr (computes) model_->load_batch(b);
    forward(zshard::use_kind::no_grad, 0.0f);
  }

  // The last pass's mean loss (waits for the device).
  double mean_loss() {
    if constexpr (computes) return model_->mean_loss();
    return 0.0;
  }

 private:
  template <class Scope, class F>
  void with(Scope&& scope, F&& f) {
    if constexpr (computes) {
      scope_ptrs<std::remove_cvref_t<Scope>, half_t> p(scope);
      f(p);
    }
  }

  void forward(zshard::use_kind kind, float grad_weight) {
    with(eng_.forward(ids_.embed, kind), [&](auto& p) { model_->embed_forward(p); });
    // The arena is the model's whole activation memory, held from the first forward on.
    eng_.report_activations(activation_bytes_);
    for (int l = 0; l < layers(); ++l)
      with(eng_.forward(ids_.blocks[std::size_t(l)], kind), [&](auto& p) { model_->block_forward(l, p); });
    with(eng_.forward(ids_.head, kind), [&](auto& p) { model_->head_forward(p, grad_weight); });
  }

  int layers() const { return int(ids_.blocks.size()); }

  Engine& eng_;
  const Ids& ids_;
  Model* model_;
  std::size_t activation_bytes_;
  bool checkpoint_;
};

// The same model with every parameter resident and a hand-written optimizer step: the plain
// training loop of a single-device stack. Backend: where the buffers live (its ledger counts
// them) and whose AdamW and sum-of-squares kernels run; the Ops must compute on the same memory.
template <class Backend, class Ops>
class plain_trainer {
 public:
  using half_t = typename Ops::half_t;

  // seed: the one the engine's spec was made with (make_zshard_model), so both start equal.
  plain_trainer(Backend& backend, const zshard_model& ids, std::uint64_t seed, ops_gpt<Ops>& model,
                zshard::optim::adamw_config hyper, double clip_norm, typename Backend::stream stream)
      : b_(backend), ids_(ids), model_(model), hyper_(hyper), clip_(clip_norm), s_(stream) {
    for (const auto& m : ids.desc) {
      if (m.params.empty()) continue;
      auto& mod = modules_.emplace_back();
      for (const auto& pd : m.params) {
        const std::size_t n = std::size_t(pd.numel());
        std::vector<float> init(n);
        const std::uint64_t name_hash = hash_string(pd.name);
        for (std::size_t i = 0; i < n; ++i) init[i] = init_value(pd, name_hash, std::int64_t(i), seed);
        param p{pd.decay, buf(zshard::dtype::f32, n, zshard::mem_category::optimizer_state),
                buf(zshard::dtype::f32, n, zshard::mem_category::optimizer_state),
                buf(zshard::dtype::f32, n, zshard::mem_category::optimizer_state),
                buf(half_dtype<half_t>, n, zshard::mem_category::sharded_params),
                buf(zshard::dtype::f32, n, zshard::mem_category::grad_shards)};
        b_.copy(p.master.data(), init.data(), n * 4, s_);
        b_.convert(p.master.data(), zshard::dtype::f32, p.working.data(), half_dtype<half_t>, n, s_);
        for (auto* z : {&p.m, &p.v, &p.grad}) b_.fill_zero(z->data(), z->bytes(), s_);
        mod.params.push_back(std::move(p));
      }
    }
    b_.synchronize(s_);
  }

  // One optimizer step over `micro` micro-batches (gradients accumulate), as the engine's
  // step(): global L2 norm over every gradient, clip, AdamW on each parameter, zero gradients.
  // Returns the global gradient norm.
  double train_step(const std::vector<batch>& micro) {
    for (const auto& b : micro) {
      const float w = 1.0f / float(std::size_t(b.batch_size) * b.seq_len);
      model_.load_batch(b);
      model_.embed_forward(view(0));
      for (int l = 0; l < ids_.config.n_layers; ++l) model_.block_forward(l, view(1 + l));
      model_.head_forward(view(head()), w);
      model_.head_backward(view(head()));
      for (int l = ids_.config.n_layers; l-- > 0;) {
        if (model_.checkpointed()) model_.block_forward(l, view(1 + l));  // recompute: one shared cache
        model_.block_backward(l, view(1 + l));
      }
      model_.embed_backward(view(0));
    }
    const double total = sum_of_squares();
    const double denom = double(micro.size());
    const double norm = std::sqrt(total) / denom;
    const float scale = float(zshard::optim::clip_coefficient(norm, clip_) / denom);
    ++step_;
    // As the engine's Offloader: one launch per two dozen parameters where the backend batches.
    tasks_.clear();
    for (auto& mod : modules_)
      for (auto& p : mod.params) {
        const auto st = zshard::optim::make_adamw_step(hyper_, step_, scale, p.decay);
        if constexpr (zshard::batched_adamw<Backend>) {
          tasks_.push_back({st, p.master.template as<float>(), p.m.template as<float>(), p.v.template as<float>(),
                            p.grad.template as<float>(), p.grad.numel(), p.working.data(), half_dtype<half_t>});
        } else {
          b_.adamw(st, p.master.template as<float>(), p.m.template as<float>(), p.v.template as<float>(),
                   p.grad.template as<float>(), p.grad.numel(), p.working.data(), half_dtype<half_t>, s_);
          b_.fill_zero(p.grad.data(), p.grad.bytes(), s_);
        }
      }
    if constexpr (zshard::batched_adamw<Backend>) b_.adamw_batch(tasks_, /*zero_grad=*/true, s_);
    return norm;
  }

  void set_lr(float lr) { hyper_.lr = lr; }

  // The f32 master value of a module's k-th parameter (tests).
  std::vector<float> master(std::size_t module, int k) {
    const auto& p = modules_[module].params[std::size_t(k)];
    std::vector<float> out(p.master.numel());
    b_.copy(out.data(), p.master.data(), p.master.bytes(), s_);
    b_.synchronize(s_);
    return out;
  }

 private:
  struct param {
    bool decay;
    zshard::buffer<Backend> master, m, v, working, grad;
  };
  struct module_state {
    std::vector<param> params;
  };
  struct ptrs {
    module_state* mod;
    const half_t* param(int k) const { return mod->params[std::size_t(k)].working.template as<const half_t>(); }
    float* grad(int k) { return mod->params[std::size_t(k)].grad.template as<float>(); }
  };

  // Every gradient's sum of squares, added in double in parameter order (as the engine's
  // Offloader does): on a backend that can reduce into device memory, one slot per gradient
  // and one read; otherwise one grad_stats_of each.
  double sum_of_squares() {
    double total = 0;
    if constexpr (requires(double* out) { b_.sum_squares_into(static_cast<const float*>(nullptr), 0, out, s_); }) {
      std::size_t count = 0;
      for (auto& mod : modules_) count += mod.params.size();
      zshard::buffer<Backend> slots(b_, zshard::dtype::f32, 2 * count, zshard::mem_category::scratch, s_);
      double* dev = slots.template as<double>();
      if constexpr (zshard::batched_sum_squares<Backend>) {
        ptrs_.clear();
        sizes_.clear();
        for (auto& mod : modules_)
          for (auto& p : mod.params) {
            ptrs_.push_back(p.grad.template as<float>());
            sizes_.push_back(p.grad.numel());
          }
        b_.sum_squares_batch(ptrs_, sizes_, dev, s_);
      } else {
        std::size_t i = 0;
        for (auto& mod : modules_)
          for (auto& p : mod.params) b_.sum_squares_into(p.grad.template as<float>(), p.grad.numel(), dev + i++, s_);
      }
      sums_.resize(count);
      b_.copy(sums_.data(), dev, count * sizeof(double), s_);
      b_.synchronize(s_);
      slots.reset_on(s_);
      for (double x : sums_) total += x;
    } else {
      for (auto& mod : modules_)
        for (auto& p : mod.params) total += b_.grad_stats_of(p.grad.template as<float>(), p.grad.numel(), s_).sum_squares;
    }
    return total;
  }

  zshard::buffer<Backend> buf(zshard::dtype t, std::size_t n, zshard::mem_category c) {
    return zshard::buffer<Backend>(b_, t, n, c, s_);
  }
  ptrs view(int module) { return {&modules_[std::size_t(module)]}; }
  int head() const { return 1 + ids_.config.n_layers; }

  Backend& b_;
  const zshard_model& ids_;
  ops_gpt<Ops>& model_;
  zshard::optim::adamw_config hyper_;
  double clip_;
  typename Backend::stream s_;
  std::vector<module_state> modules_;
  std::vector<double> sums_;
  std::vector<const float*> ptrs_;  // batched sums of squares
  std::vector<std::size_t> sizes_;
  std::vector<zshard::adamw_task> tasks_;  // batched AdamW
  std::int64_t step_ = 0;
};

}  // namespace gpt

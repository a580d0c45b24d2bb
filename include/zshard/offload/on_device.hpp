#pragma once
// The default Offloader: optimizer state and gradient shards stay on the backend's device.
// Per trainable parameter: fp32 master shard, AdamW m and v, and an fp32 gradient shard that
// accumulates over micro-batches. The update runs on the backend's AdamW kernel, which writes
// the working (f32/bf16/f16) shard in the same pass. A frozen parameter has no state until it
// is first unfrozen (set_trainable); freezing it again keeps its state (and its update count)
// for the next unfreeze.
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zshard/backend/backend.hpp"
#include "zshard/comm/communicator.hpp"
#include "zshard/core/checked_size.hpp"
#include "zshard/core/param_table.hpp"
#include "zshard/offload/host_memory.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/optim/grad_clip.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard::offload {

template <class Backend, class Comm>
class on_device_impl {
 public:
  static constexpr bool applies_param_groups = true;  // update_args::groups
  // offload_config tunes the host Offloader only: nothing of it applies on the device, and the
  // tiers it names beyond the device are refused by name.
  on_device_impl(param_store<Backend>& store, Comm& comm, const optim::adamw_config& hyper, const offload_config& oc)
      : store_(store), comm_(comm), hyper_(hyper) {
    ZSHARD_REQUIRE(oc.params == offload_tier::device, error_kind::config,
                   "offload_config.params = " + std::string(to_string(oc.params)) +
                       " with offload::on_device, which updates working shards on the device",
                   "use offload::host_adam, which keeps parameter shards in host memory and updates them there");
    ZSHARD_REQUIRE(oc.optimizer_state != offload_tier::nvme, error_kind::config,
                   "offload_config.optimizer_state = nvme with offload::on_device, which keeps it on the device",
                   "use offload::host_adam for optimizer state on NVMe");
    state_.resize(store.size());
    has_grad_.assign(store.size(), 0);
    for (param_id p = 0; p < store.size(); ++p) {
      state_[p].decay = store[p].spec->decay;
      state_[p].replicated = store[p].layout.replicated;
    }
    for (param_id p = 0; p < store.size(); ++p)
      if (store[p].spec->trainable) create_state(p);
  }

  void init_param(param_id p, const float* values) {
    auto& st = state_[p];
    store_.backend().copy(st.master.data(), values, st.master.bytes(), compute());
  }

  // On g's stream (the reduce stream): the shard gradient is read next by the step, which the
  // engine orders after the reduce stream.
  void accumulate_grad(param_id p, const float* g, std::size_t n, typename Backend::stream& ready_on) {
    store_.backend().add_into(state_[p].grad.template as<float>(), g, n, ready_on);
    has_grad_[p] = 1;
  }

  // A backend that can reduce into device memory (sum_squares_into, CUDA) gets one host round
  // trip per step: each gradient's sum of squares goes into its own device slot, then one copy
  // and one wait bring them all. Otherwise (host backends, whose "device" is the host) one
  // grad_stats_of per parameter, which costs nothing there.
  grad_stats local_grad_stats() {
    Backend& b = store_.backend();
    grad_stats total;
    if constexpr (sums_on_device) {
      counted_.clear();
      for (param_id p = 0; p < store_.size(); ++p)
        if (counts(p)) counted_.push_back(p);
      if (counted_.empty()) return total;
      // doubles, as pairs of f32 words: the buffer only carries bytes
      buffer<Backend> slots(b, dtype::f32, 2 * counted_.size(), mem_category::scratch, compute());
      double* dev = slots.template as<double>();
      if constexpr (batched_sum_squares<Backend>) {  // one launch for many gradients
        grad_ptrs_.clear();
        grad_sizes_.clear();
        for (param_id p : counted_) {
          grad_ptrs_.push_back(state_[p].grad.template as<float>());
          grad_sizes_.push_back(state_[p].grad.numel());
        }
        b.sum_squares_batch(grad_ptrs_, grad_sizes_, dev, compute());
      } else {
        for (std::size_t i = 0; i < counted_.size(); ++i) {
          const auto& g = state_[counted_[i]].grad;
          b.sum_squares_into(g.template as<float>(), g.numel(), dev + i, compute());
        }
      }
      sums_.resize(counted_.size());
      b.copy(sums_.data(), dev, sums_.size() * sizeof(double), compute());
      b.synchronize(compute());
      slots.reset_on(compute());
      for (double sum : sums_) total += grad_stats{sum, !std::isfinite(sum)};
    } else {
      for (param_id p = 0; p < store_.size(); ++p)
        if (counts(p))
          total += b.grad_stats_of(state_[p].grad.template as<float>(), state_[p].grad.numel(), compute());
    }
    return total;
  }

  // A backend with adamw_batch (CUDA) gets one launch per two dozen parameters, the gradients
  // zeroed in the same pass; otherwise one adamw and one fill_zero per parameter.
  void update(const update_args& a) {
    Backend& b = store_.backend();
    optim::adamw_config hyper = hyper_;
    hyper.lr = a.lr;
    tasks_.clear();
    std::int64_t steps_for = 0;  // the update count steps_ holds the constants of (0: none yet)
    for (param_id p = 0; p < store_.size(); ++p) {
      // No gradient this step: left alone as PyTorch does (unless update_params_without_grad),
      // its own step count (bias correction) unchanged. (has_grad_ first: it is compact, so a
      // step over a model without gradients reads no state.)
      if (!has_grad_[p] && !hyper_.update_params_without_grad) continue;
      auto& st = state_[p];
      if (!st.trainable) continue;  // frozen (its state, if any, kept as it is)
      has_grad_[p] = 0;
      auto& slot = store_[p];
      ++st.steps;
      // The AdamW constants per (group, decay) for this update count: two pow calls per count,
      // not per parameter (parameters that skipped steps lag, so the count can change).
      if (st.steps != steps_for) {
        fill_steps(a, hyper, st.steps);
        steps_for = st.steps;
      }
      const optim::adamw_step& step = steps_[a.groups ? a.groups->slot(p, st.decay) : (st.decay ? 1 : 0)];
      if constexpr (batched_adamw<Backend>) {
        tasks_.push_back({step, st.master.template as<float>(), st.m.template as<float>(), st.v.template as<float>(),
                          st.grad.template as<float>(), st.grad.numel(), slot.shard.data(), slot.type});
      } else {
        b.adamw(step, st.master.template as<float>(), st.m.template as<float>(), st.v.template as<float>(),
                st.grad.template as<float>(), st.grad.numel(), slot.shard.data(), slot.type, compute());
        b.fill_zero(st.grad.data(), st.grad.bytes(), compute());
      }
    }
    if constexpr (batched_adamw<Backend>)
      if (!tasks_.empty()) b.adamw_batch(tasks_, /*zero_grad=*/true, compute());
  }

  // Each parameter's own update count (its AdamW bias correction), by param_id: a parameter
  // skipped in a step (no gradient) lags the engine's step. Checkpoints save and restore them
  // (checkpoint/manifest.hpp); set_update_counts(steps) is the fallback for a checkpoint that
  // has none: every parameter continues from the engine's count.
  std::vector<std::int64_t> update_counts() const {
    std::vector<std::int64_t> out;
    out.reserve(state_.size());
    for (const auto& st : state_) out.push_back(st.steps);
    return out;
  }
  void set_update_counts(std::span<const std::int64_t> counts) {
    ZSHARD_REQUIRE(counts.size() == state_.size(), error_kind::usage,
                   std::to_string(counts.size()) + " update counts for " + std::to_string(state_.size()) + " parameters");
    for (std::size_t p = 0; p < counts.size(); ++p) state_[p].steps = counts[p];
  }
  void set_update_counts(std::int64_t steps) {
    for (auto& st : state_) st.steps = steps;
  }

  void discard_grads() {
    for (auto& st : state_)
      if (st.grad) store_.backend().fill_zero(st.grad.data(), st.grad.bytes(), compute());
    has_grad_.assign(has_grad_.size(), 0);
  }

  const memory_ledger& state_ledger() const noexcept { return store_.backend().ledger(); }

  // L1 / L-inf part over the gradients this rank owns (optim/grad_clip.hpp, engine/grad_norm.hpp),
  // one shard at a time through host memory: a pass the L2 path does not need (no device kernel
  // for it yet).
  double local_grad_norm_part(double norm_type) {
    double part = 0.0;
    for (param_id p = 0; p < store_.size(); ++p) {
      if (!state_[p].trainable || !has_grad_[p]) continue;
      if (norm_type == 1.0 && store_[p].layout.replicated && comm_.rank() != 0) continue;
      host_.resize(state_[p].grad.numel());
      read_grad(p, host_.data());
      part = optim::combine_norm_parts(part, optim::norm_part(host_.data(), host_.size(), norm_type), norm_type);
    }
    return part;
  }

  // p's accumulated gradient shard (shard_numel f32) into host memory, complete on return.
  void read_grad(param_id p, float* dst) {
    const auto& st = state_[p];
    ZSHARD_REQUIRE(st.trainable, error_kind::usage, "parameter '" + store_[p].spec->name + "' has no gradient shard");
    store_.backend().copy(dst, st.grad.data(), st.grad.bytes(), compute());
    store_.backend().synchronize(compute());
  }

  // Between steps (the gradients are zero). Unfreezing a parameter that never trained creates its
  // state: master from the working shard (exact for f32 working parameters), m = v = 0, update
  // count 0 (its AdamW bias correction starts over, as torch.optim's per-parameter step does).
  void set_trainable(param_id p, bool trainable) {
    auto& st = state_[p];
    if (trainable && !st.master) {
      create_state(p);
      const auto& slot = store_[p];
      store_.backend().convert(slot.shard.data(), slot.type, st.master.data(), dtype::f32, slot.layout.shard_numel,
                               compute());
      store_.backend().synchronize(compute());
    }
    st.trainable = trainable;
  }
  // Whether p has optimizer state: trainable now, or frozen with the state it kept (checkpoints
  // save it). State can always be created here (can_add_state).
  bool has_state(param_id p) const noexcept { return p < state_.size() && bool(state_[p].master); }
  bool can_add_state(param_id) const noexcept { return true; }

  // The fp32 master shard of p (tests and checkpoints read it).
  const buffer<Backend>& master(param_id p) const noexcept { return state_[p].master; }

  // State access (state/state_access.hpp): elements [offset, offset + n) of p's master, m or v
  // shard to or from host memory, complete on return.
  void read_state(param_id p, state_field f, std::size_t offset, float* dst, std::size_t n) {
    const buffer<Backend>& b = field(p, f, offset, n);
    store_.backend().copy(dst, b.template as<float>() + offset, n * sizeof(float), compute());
    store_.backend().synchronize(compute());
  }
  // p's field as host memory the CPU may read and write, when the backend's memory is host
  // memory; else null (checkpoints then move data through a staging chunk).
  float* state_host_data(param_id p, state_field f) {
    if constexpr (offload::memory_is_host<Backend>())
      return field(p, f, 0, 0).template as<float>();
    else
      return nullptr;
  }
  void write_state(param_id p, state_field f, std::size_t offset, const float* src, std::size_t n) {
    const buffer<Backend>& b = field(p, f, offset, n);
    store_.backend().copy(b.template as<float>() + offset, src, n * sizeof(float), compute());
    store_.backend().synchronize(compute());
  }

 private:
  struct param_state {
    // grad and the flags first, so that a reduction and the gradient statistics of a step read one
    // line of the entry (update() reads the rest)
    buffer<Backend> grad;
    std::int64_t steps = 0;   // updates applied to it
    bool trainable = false;   // updated by update(); a frozen parameter keeps its buffers, if any
    bool decay = true;        // the parameter's (fixed) weight decay flag, kept here for update()
    bool replicated = false;  // its layout's (fixed): a replicated gradient counts on rank 0 only
    buffer<Backend> master, m, v;
  };

  // AdamW's constants for update count `step`, per (group, decay) slot as param_groups numbers them.
  void fill_steps(const update_args& a, const optim::adamw_config& hyper, std::int64_t step) {
    if (a.groups) {
      a.groups->steps(hyper, step, a.grad_scale, steps_);
    } else {
      steps_.resize(2);
      steps_[0] = optim::make_adamw_step(hyper, step, a.grad_scale, false);
      steps_[1] = optim::make_adamw_step(hyper, step, a.grad_scale, true);
    }
  }

  void create_state(param_id p) {
    Backend& b = store_.backend();
    const std::size_t n = store_[p].layout.shard_numel;
    param_state st;
    st.master = buffer<Backend>(b, dtype::f32, n, mem_category::optimizer_state, compute());
    st.m = buffer<Backend>(b, dtype::f32, n, mem_category::optimizer_state, compute());
    st.v = buffer<Backend>(b, dtype::f32, n, mem_category::optimizer_state, compute());
    st.grad = buffer<Backend>(b, dtype::f32, n, mem_category::grad_shards, compute());
    b.fill_zero(st.m.data(), st.m.bytes(), compute());
    b.fill_zero(st.v.data(), st.v.bytes(), compute());
    b.fill_zero(st.grad.data(), st.grad.bytes(), compute());
    st.trainable = true;
    st.decay = store_[p].spec->decay;
    st.replicated = store_[p].layout.replicated;
    state_[p] = std::move(st);
  }

  static constexpr bool sums_on_device = requires(Backend& b, const float* g, std::size_t n, double* out,
                                                 typename Backend::stream& st) { b.sum_squares_into(g, n, out, st); };

  // Whether p's gradient counts on this rank: trainable, and replicated values on rank 0 only.
  bool counts(param_id p) const noexcept {
    const auto& st = state_[p];
    return st.trainable && !(st.replicated && comm_.rank() != 0);
  }

  // Init, update and gradient statistics run on the compute stream (see offloader.hpp).
  typename Backend::stream& compute() noexcept { return store_.streams().on(stream_role::compute); }

  const buffer<Backend>& field(param_id p, state_field f, std::size_t offset, std::size_t n) const {
    ZSHARD_REQUIRE(p < state_.size() && state_[p].master, error_kind::usage,
                   "parameter #" + std::to_string(p) + " has no optimizer state (frozen or out of range)");
    const auto& st = state_[p];
    const buffer<Backend>& b = f == state_field::master ? st.master : f == state_field::m ? st.m : st.v;
    ZSHARD_REQUIRE(f != state_field::working && range_within(offset, n, b.numel()), error_kind::usage,
                   "state access of " + std::string(to_string(f)) + ": " + describe_range(offset, n) +
                       " of a shard of " + std::to_string(b.numel()));
    return b;
  }

  param_store<Backend>& store_;
  Comm& comm_;
  const optim::adamw_config hyper_;
  param_table<param_state> state_;
  // Per parameter: a reduced gradient arrived since the last update or discard. Apart from the
  // state, so that marking one (every reduction) and skipping one (every step) touch a byte.
  std::vector<std::uint8_t> has_grad_;
  std::vector<optim::adamw_step> steps_;  // update(): AdamW's constants per (group, decay) slot
  std::vector<param_id> counted_;  // local_grad_stats: kept between steps, so no step allocates
  std::vector<double> sums_;
  std::vector<const float*> grad_ptrs_;  // batched sums of squares
  std::vector<std::size_t> grad_sizes_;
  std::vector<adamw_task> tasks_;  // batched AdamW
  std::vector<float> host_;  // one gradient shard, for the L1 / L-inf norms
};

struct on_device {
  using zshard_tag = offloader_tag;
  template <class Backend, class Comm>
  using impl = on_device_impl<Backend, Comm>;
};

}  // namespace zshard::offload

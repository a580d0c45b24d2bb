#pragma once
// The default HookTracker: counts per call, not per module (I1). A module forwarded twice in a
// step has two pending backward uses; a parameter shared by several modules is complete only
// when every counted use of every module that lists it has run its backward.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "zshard/track/hook_tracker.hpp"

namespace zshard::track {

class use_counter {
 public:
  using zshard_tag = hook_tracker_tag;
  template <class Backend, class Comm>
  using impl = use_counter;

  void reset(const model_spec& spec) {
    spec_ = &spec;
    module_pending_.assign(spec.modules().size(), 0);
    awaiting_backward_.assign(spec.modules().size(), false);
    param_pending_.assign(spec.params().size(), 0);
    trainable_.resize(spec.params().size());
    for (param_id p = 0; p < trainable_.size(); ++p) trainable_[p] = spec.params()[p].trainable;
    max_pending_.assign(spec.modules().size(), 0);
    phase_ = step_phase::forward;
    depth_ = max_depth_ = 0;
  }

  bool on_forward(module_id m, use_kind kind) {
    if (kind == use_kind::recompute) {
      ZSHARD_REQUIRE(phase_ == step_phase::backward, error_kind::usage,
                     "recompute of module '" + name(m) + "' outside backward",
                     "recompute() re-runs a checkpointed block during backward; use forward() before begin_backward()");
      awaiting_backward_[m] = module_pending_[m] > 0;
      return false;
    }
    if (kind == use_kind::no_grad) return false;
    ZSHARD_REQUIRE(
        phase_ == step_phase::forward, error_kind::usage, "counted forward of module '" + name(m) + "' during backward",
        "use recompute() for a checkpointed block, or forward(m, use_kind::no_grad) for a pass without backward");
    max_pending_[m] = std::max(max_pending_[m], ++module_pending_[m]);
    for (param_id p : spec_->modules()[m].params)
      if (trainable_[p]) ++param_pending_[p];
    return true;
  }

  // The engine could not open the scope it just reported (a budget, an allocation): the use
  // did not happen. (A backward's only change, ending a recompute's hold, needs no undoing.)
  void on_scope_failed(module_id m, use_kind kind, bool backward) noexcept {
    if (backward || kind != use_kind::counted) return;
    --module_pending_[m];
    for (param_id p : spec_->modules()[m].params)
      if (trainable_[p]) --param_pending_[p];
  }

  void on_begin_backward() {
    ZSHARD_REQUIRE(phase_ == step_phase::forward, error_kind::usage,
                   "begin_backward() called twice without end_backward()");
    phase_ = step_phase::backward;
  }

  void on_backward(module_id m) {
    ZSHARD_REQUIRE(phase_ == step_phase::backward, error_kind::usage,
                   "backward of module '" + name(m) + "' outside backward", "call begin_backward() first");
    ZSHARD_REQUIRE(module_pending_[m] > 0, error_kind::usage,
                   "backward of module '" + name(m) + "' which has no counted forward pending",
                   "each backward(m) must match an earlier counted forward(m) of this micro-batch");
    awaiting_backward_[m] = false;
    max_depth_ = std::max(max_depth_, ++depth_);
  }

  void on_backward_done(module_id m, std::vector<param_id>& completed) {
    --module_pending_[m];
    --depth_;
    for (param_id p : spec_->modules()[m].params) {
      if (!trainable_[p]) continue;
      ZSHARD_REQUIRE(param_pending_[p] > 0, error_kind::invariant,
                     "gradient count of parameter '" + spec_->param(p).name + "' would go negative");
      if (--param_pending_[p] == 0) completed.push_back(p);
    }
  }

  void on_end_backward(std::vector<param_id>& completed, std::vector<swept_use>& swept) {
    ZSHARD_REQUIRE(phase_ == step_phase::backward, error_kind::usage, "end_backward() without begin_backward()");
    for (module_id m = 0; m < module_pending_.size(); ++m) {
      if (module_pending_[m] == 0) continue;
      swept.push_back({m, module_pending_[m]});
      module_pending_[m] = 0;
    }
    awaiting_backward_.assign(awaiting_backward_.size(), false);
    depth_ = 0;
    for (param_id p = 0; p < param_pending_.size(); ++p) {
      if (param_pending_[p] == 0) continue;
      param_pending_[p] = 0;
      completed.push_back(p);
    }
    phase_ = step_phase::forward;
  }

  void on_step() {
    ZSHARD_REQUIRE(phase_ == step_phase::forward, error_kind::usage, "step() inside backward",
                   "call end_backward() before step()");
    for (module_id m = 0; m < module_pending_.size(); ++m)
      ZSHARD_REQUIRE(module_pending_[m] == 0, error_kind::usage,
                     "step() with " + std::to_string(module_pending_[m]) + " counted forward(s) of module '" + name(m) +
                         "' whose backward has not run",
                     "run begin_backward()/end_backward() after the last forward of the micro-batch");
  }

  // Holds a recomputed module until its backward, which usually comes right after, so it is not
  // gathered twice in a row: a preferred hold, which yields to max_live_numel
  // (engine/residency.hpp). Nothing is held bindingly: reuse across other modules is the
  // Prefetcher's (advisory) call. So a tight max_live_numel never fails on a hold, nested
  // activation checkpointing included (recomputed inner modules waiting for their backward
  // while their siblings recompute: the engine releases them to make room and gathers them
  // again for their backward).
  void on_set_trainable(param_id p, bool trainable) noexcept { trainable_[p] = trainable; }

  bool keeps_gathered(module_id) const noexcept { return false; }
  bool prefers_gathered(module_id m) const noexcept { return phase_ == step_phase::backward && awaiting_backward_[m]; }

  step_phase phase() const noexcept { return phase_; }
  std::int64_t pending_uses(module_id m) const noexcept { return module_pending_[m]; }
  std::int64_t pending_grads(param_id p) const noexcept { return param_pending_[p]; }
  // Since reset(): the most counted uses of m pending at once (2 or more: m's gradients wait
  // for a later backward), and the deepest nesting of backward scopes. The memory bound check
  // (testing/invariants.hpp) reads them.
  std::int64_t max_pending_uses(module_id m) const noexcept { return max_pending_[m]; }
  int max_backward_depth() const noexcept { return max_depth_; }

 private:
  std::string name(module_id m) const { return spec_->module(m).name; }

  const model_spec* spec_ = nullptr;
  std::vector<std::int64_t> module_pending_;
  std::vector<std::int64_t> param_pending_;
  // The spec's trainable flags, one byte each: read per parameter on every counted scope.
  std::vector<std::uint8_t> trainable_;
  std::vector<bool> awaiting_backward_;  // recomputed, its backward not yet entered
  std::vector<std::int64_t> max_pending_;
  step_phase phase_ = step_phase::forward;
  int depth_ = 0, max_depth_ = 0;  // backward scopes open now, and at most
};

static_assert(check_hook_tracker<use_counter>());

}  // namespace zshard::track

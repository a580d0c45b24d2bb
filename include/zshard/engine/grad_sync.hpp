#pragma once
// No-sync gradient accumulation (FSDP's set_requires_gradient_sync(False), DDP's no_sync()):
// while sync is off, a parameter's full gradient is not reduced when its backward completes; it
// stays (f32, padded, ledger category grad_buckets) for the next micro-batches to accumulate
// into, and is reduced once, by the first micro-batch that runs with sync on again. That saves
// a reduce-scatter per parameter per micro-batch at the price of every trainable parameter's
// full gradient on every rank (testing::memory_bound_violations allows for it; the memory
// planner models it with plan_options::no_sync), so it pays off when communication, not memory, is the limit.
//
// Collective: whether gradients are reduced decides which collectives run, so every rank sets
// the same sync state for the same micro-batches (the engine checks that they agree).
#include <vector>

#include "zshard/model/model_spec.hpp"

namespace zshard {

class grad_sync {
 public:
  explicit grad_sync(std::size_t params) : unsynced_(params, false) { held_.reserve(params); }

  bool enabled() const noexcept { return enabled_; }
  void set(bool on) noexcept {
    enabled_ = on;
    ever_off_ = ever_off_ || !on;
  }
  // Whether sync was ever off: full gradients may then have been held for every parameter.
  bool ever_off() const noexcept { return ever_off_; }

  // p's gradient is complete for this micro-batch: reduce it now, or hold it (sync off).
  template <class Reduce>
  void complete(param_id p, Reduce&& reduce) {
    if (!enabled_) {
      if (!unsynced_[p]) held_.push_back(p);
      unsynced_[p] = true;
      return;
    }
    if (!held_.empty()) unsynced_[p] = false;  // reduced now with what earlier micro-batches left in it
    reduce(p);
  }

  // End of a micro-batch's backward. With sync on, the gradients held from earlier micro-batches
  // that this one did not complete (a module it did not run) are reduced too.
  template <class Reduce>
  void end_backward(Reduce&& reduce) {
    if (!enabled_) return;
    for (param_id p : held_)
      if (unsynced_[p]) {
        unsynced_[p] = false;
        reduce(p);
      }
    held_.clear();
  }

  // Whether p's full gradient waits, unreduced, for a synced micro-batch.
  bool held(param_id p) const noexcept { return unsynced_[p]; }
  // discard_gradients(): the held gradients were dropped with every other.
  void discard() noexcept {
    unsynced_.assign(unsynced_.size(), false);
    held_.clear();
  }

  // Gradients held unreduced (step() refuses to run over them).
  bool holding() const noexcept { return !held_.empty(); }
  std::size_t held_count() const noexcept { return held_.size(); }

 private:
  bool enabled_ = true;
  bool ever_off_ = false;
  std::vector<bool> unsynced_;  // per parameter: a full gradient waits to be reduced
  std::vector<param_id> held_;  // those parameters (and some already reduced), in completion order
};

}  // namespace zshard

#pragma once
// A HookTracker that reproduces the regression zshard exists to prevent (DESIGN.md, "the
// lesson"): a per-module counter bumped on *every* forward — recomputes of checkpointed
// blocks and no-grad passes included — decremented by backward, never reset. Under
// activation checkpointing no module's counter returns to zero, so every module is held
// gathered through backward and the resident parameters grow until the budget breaks.
//
// Test-only (tests/support/legacy/, outside the public include tree, with the two other legacy
// mechanisms): it exists so tests and bench/seed_70b can show, by a compile-time policy swap,
// that the same run leaks with it and stays flat with the default. Never use it to train.
#include <vector>

#include "zshard/track/use_counter.hpp"

namespace legacy {

using namespace zshard;

class tracker : public track::use_counter {
 public:
  template <class Backend, class Comm>
  using impl = tracker;  // not the base's: a derived policy names itself again
  void reset(const model_spec& spec) {
    use_counter::reset(spec);
    drifting_.assign(spec.modules().size(), 0);
  }

  bool on_forward(module_id m, use_kind kind) {
    ++drifting_[m];  // the bug: counts recomputes and no-grad forwards too
    return use_counter::on_forward(m, kind);
  }

  void on_backward_done(module_id m, std::vector<param_id>& completed) {
    --drifting_[m];
    use_counter::on_backward_done(m, completed);
  }

  // Held while the drifting counter says a backward is still to come: always, once drifted.
  bool keeps_gathered(module_id m) const noexcept { return phase() == step_phase::backward && drifting_[m] > 0; }

  std::int64_t drifting_count(module_id m) const noexcept { return drifting_[m]; }

 private:
  std::vector<std::int64_t> drifting_;  // never reset between steps: the second bug
};

static_assert(check_hook_tracker<tracker>());

}  // namespace legacy

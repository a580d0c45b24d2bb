#pragma once
// Restoring the engine's run counters and per-parameter AdamW update counts (checkpoint resume).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/optim/loss_scaler.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard {

template <class Engine>
class step_counters {
 public:
  // Validates all of s before changing anything.
  static void restore_run_counters(Engine& e, const run_state& s) {
    e.check_between_steps("restore_run_counters");
    ZSHARD_REQUIRE(s.step >= 0, error_kind::config, "run state has a negative step count " + std::to_string(s.step));
    ZSHARD_REQUIRE(std::isfinite(s.lr) && s.lr > 0, error_kind::config,
                   "run state has learning rate " + std::to_string(s.lr) + ", not positive and finite");
    optim::loss_scaler scaler = e.scaler_;
    scaler.restore(s.scaler);
    e.scaler_ = scaler;
    e.ctl_.groups.set_lr(0, s.lr);
    e.step_ = s.step;
    // Without per-parameter counts (restore_update_counts), every parameter continues from the step.
    if constexpr (requires { e.offloader_.set_update_counts(s.step); }) e.offloader_.set_update_counts(s.step);
  }

  // Every count in [0, steps_taken()], one per parameter; validated before anything changes.
  static void restore_update_counts(Engine& e, const std::vector<std::int64_t>& counts) {
    e.check_between_steps("restore_update_counts");
    ZSHARD_REQUIRE(counts.size() == e.spec_.params().size(), error_kind::config,
                   std::to_string(counts.size()) + " update counts for a model of " +
                       std::to_string(e.spec_.params().size()) + " parameters");
    for (std::size_t p = 0; p < counts.size(); ++p)
      ZSHARD_REQUIRE(counts[p] >= 0 && counts[p] <= e.step_, error_kind::config,
                     "update count " + std::to_string(counts[p]) + " of '" + e.spec_.params()[p].name +
                         "' is outside [0, " + std::to_string(e.step_) + "] (the engine's step)");
    if constexpr (requires { e.offloader_.set_update_counts(std::span<const std::int64_t>(counts)); })
      e.offloader_.set_update_counts(std::span<const std::int64_t>(counts));
  }
};

}  // namespace zshard

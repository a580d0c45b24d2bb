#pragma once
// What step() tells the training loop about the optimizer step it just ran.
#include <cstdint>
#include <vector>

#include "zshard/track/hook_tracker.hpp"

namespace zshard {

struct step_report {
  std::int64_t step = 0;        // optimizer steps taken so far (skipped steps not counted)
  int micro_batches = 0;        // backward passes accumulated into this step
  bool skipped = false;         // Inf/NaN in some rank's gradient: nothing was updated
  double grad_norm = 0.0;       // global L2 norm of the averaged, unscaled gradient (before clipping)
  double clip_coefficient = 1.0;
  float loss_scale = 1.0f;      // the scale in force for the *next* step
  std::vector<swept_use> swept; // counted uses whose backward never ran (I3), over all micro-batches
};

}  // namespace zshard

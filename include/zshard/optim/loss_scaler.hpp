#pragma once
// Dynamic loss scaling for f16 training (the scheme of torch.cuda.amp.GradScaler): the loss is
// multiplied by scale() before backward so small gradients survive f16's narrow range, and
// the optimizer unscales them again through adamw_step::grad_scale. A step whose gradients
// overflowed (inf/NaN anywhere) is skipped and the scale backs off; after growth_interval
// clean steps in a row it grows again.
//
// The overflow decision must be global: every rank must pass the same found_overflow to
// update(), or the ranks' scales diverge and so do their updates. The engine therefore
// all-reduces (max) a per-rank overflow flag before calling update() and before deciding to
// skip the optimizer step; a loss_scaler never communicates on its own.
#include <cmath>
#include <cstdint>
#include <string>

#include "zshard/core/error.hpp"

namespace zshard::optim {

struct loss_scale_config {
  bool enabled = false;  // on for f16 working params; bf16 and f32 have f32's range and need none
  float initial_scale = 65536.f;
  float growth_factor = 2.f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;  // clean steps in a row before the scale grows
  float min_scale = 1.f;       // the scale never backs off below this

  void validate() const {
    ZSHARD_REQUIRE(std::isfinite(min_scale) && min_scale > 0.0f, error_kind::config,
                   "loss_scale_config.min_scale = " + std::to_string(min_scale) + " must be finite and > 0",
                   "use 1, or a smaller positive value to let the scale shrink further");
    ZSHARD_REQUIRE(std::isfinite(initial_scale) && initial_scale >= min_scale, error_kind::config,
                   "loss_scale_config.initial_scale = " + std::to_string(initial_scale) +
                       " must be finite and >= min_scale = " + std::to_string(min_scale),
                   "use a power of two such as 65536 (2^16)");
    ZSHARD_REQUIRE(std::isfinite(growth_factor) && growth_factor > 1.0f, error_kind::config,
                   "loss_scale_config.growth_factor = " + std::to_string(growth_factor) + " must be finite and > 1",
                   "use 2; a power of two keeps scaling exact");
    ZSHARD_REQUIRE(backoff_factor > 0.0f && backoff_factor < 1.0f, error_kind::config,
                   "loss_scale_config.backoff_factor = " + std::to_string(backoff_factor) + " must lie in (0, 1)",
                   "use 0.5; a power of two keeps scaling exact");
    ZSHARD_REQUIRE(growth_interval >= 1, error_kind::config,
                   "loss_scale_config.growth_interval = " + std::to_string(growth_interval) + " must be >= 1",
                   "use a number of steps such as 2000");
  }
};

// Everything a checkpoint needs to resume loss scaling exactly where it stopped.
struct loss_scaler_state {
  float scale = 1.0f;
  std::int64_t skipped_steps = 0;
  std::int64_t overflows_at_min_scale = 0;
  std::int64_t good_steps_in_row = 0;
};

class loss_scaler {
 public:
  explicit loss_scaler(const loss_scale_config& cfg) : cfg_(cfg) {
    cfg_.validate();
    scale_ = cfg_.enabled ? cfg_.initial_scale : 1.0f;
  }

  bool enabled() const noexcept { return cfg_.enabled; }

  // The factor to multiply the loss by; 1 when disabled.
  float scale() const noexcept { return scale_; }

  // Call once per optimizer step with the globally agreed overflow flag. On overflow the step
  // counts as skipped (the caller skips it), the scale backs off to no less than min_scale,
  // and the run of good steps restarts. Otherwise, after growth_interval good steps in a row
  // the scale grows and the run restarts. When disabled the scale stays 1 but the counts are
  // still kept, since an f32/bf16 step with non-finite gradients is skipped as well.
  void update(bool found_overflow) noexcept {
    if (found_overflow) {
      ++skipped_;
      good_in_row_ = 0;
      if (!cfg_.enabled) return;
      if (scale_ <= cfg_.min_scale) {
        ++overflows_at_min_;  // cannot back off further: a sign the run is diverging
        return;
      }
      const float next = scale_ * cfg_.backoff_factor;
      scale_ = next < cfg_.min_scale ? cfg_.min_scale : next;
      return;
    }
    ++good_in_row_;
    if (!cfg_.enabled || good_in_row_ < cfg_.growth_interval) return;
    good_in_row_ = 0;
    const float next = scale_ * cfg_.growth_factor;
    if (std::isfinite(next)) scale_ = next;  // an infinite scale would turn every gradient to inf
  }

  // Steps reported as overflowed so far (all of them were skipped).
  std::int64_t skipped_steps() const noexcept { return skipped_; }
  // Overflows that happened with the scale already at min_scale (a subset of skipped_steps).
  std::int64_t overflows_at_min_scale() const noexcept { return overflows_at_min_; }
  // Consecutive good steps since the last overflow or growth.
  std::int64_t good_steps_in_row() const noexcept { return good_in_row_; }

  loss_scaler_state state() const noexcept { return {scale_, skipped_, overflows_at_min_, good_in_row_}; }

  void restore(const loss_scaler_state& s) {
    ZSHARD_REQUIRE(std::isfinite(s.scale) && s.scale > 0.0f, error_kind::config,
                   "loss scaler state has scale " + std::to_string(s.scale) + ", which is not finite and > 0",
                   "the checkpoint is corrupt or from another format; restart loss scaling from the config");
    ZSHARD_REQUIRE(s.skipped_steps >= 0 && s.overflows_at_min_scale >= 0 && s.good_steps_in_row >= 0,
                   error_kind::config, "loss scaler state has a negative counter",
                   "the checkpoint is corrupt or from another format; restart loss scaling from the config");
    scale_ = cfg_.enabled ? s.scale : 1.0f;
    skipped_ = s.skipped_steps;
    overflows_at_min_ = s.overflows_at_min_scale;
    good_in_row_ = s.good_steps_in_row;
  }

 private:
  loss_scale_config cfg_;
  float scale_ = 1.0f;
  std::int64_t skipped_ = 0;
  std::int64_t overflows_at_min_ = 0;
  std::int64_t good_in_row_ = 0;
};

}  // namespace zshard::optim

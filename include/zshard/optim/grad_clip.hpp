#pragma once
// Gradient clipping by a global norm, with torch.nn.utils.clip_grad_norm_ semantics: norm type
// 2 (the default), 1 or inf (engine_config::clip_norm_type). Under
// ZeRO-3 no rank holds the whole gradient: each rank sums the squares of its own fp32 gradient
// shards (norm_accumulator on host backends), the engine all-reduces (sum) those partial sums
// and the non-finite flag, takes the square root, and folds clip_coefficient() into
// adamw_step::grad_scale so clipping costs no extra pass over the gradients.
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "zshard/core/error.hpp"

namespace zshard::optim {

// The factor gradients are multiplied by: min(1, max_norm / (global_norm + 1e-6)), the 1e-6
// guarding a zero norm as PyTorch does. max_norm <= 0 turns clipping off (returns 1).
// global_norm must be the norm of the gradients as the optimizer will see them (unscaled);
// a NaN norm gives NaN and +inf gives 0, so check norm_accumulator::nonfinite first and skip
// the step rather than clip it.
inline double clip_coefficient(double global_norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0;
  ZSHARD_REQUIRE(!(global_norm < 0.0), error_kind::usage,
                 "clip_coefficient got a negative global norm " + std::to_string(global_norm),
                 "pass sqrt of the all-reduced sum of squares, not the sum of per-rank norms or a difference");
  if (std::isnan(global_norm)) return std::numeric_limits<double>::quiet_NaN();
  const double coef = max_norm / (global_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

// Accumulates one rank's part of a global squared L2 norm on the host. Squares are summed in
// double so the sum over billions of f32 elements keeps its digits, and inf/NaN in any
// element (or in the scale) sets `nonfinite`, the per-rank half of the overflow flag the
// engine all-reduces. The sum runs over four interleaved partial sums: the result is the
// same on every compiler and build flag, and the adds do not wait on each other.
struct norm_accumulator {
  double sum_squares = 0;
  bool nonfinite = false;

  // Adds sum over i of (g[i] * scale)^2, computed in double.
  void add(const float* g, std::size_t n, float scale) noexcept {
    const double s = scale;
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    const std::size_t body = n - n % 4;
    for (std::size_t i = 0; i < body; i += 4) {
      for (std::size_t k = 0; k < 4; ++k) {
        const double x = static_cast<double>(g[i + k]) * s;
        acc[k] += x * x;
      }
    }
    for (std::size_t i = body; i < n; ++i) {
      const double x = static_cast<double>(g[i]) * s;
      acc[0] += x * x;
    }
    const double part = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    // Squares of finite floats times a finite scale cannot overflow double for any realistic
    // n, so a non-finite partial sum means an inf/NaN input (inf - inf and inf * 0 give NaN).
    if (!std::isfinite(part) || (n > 0 && !std::isfinite(s))) nonfinite = true;
    sum_squares += part;
  }

  // The L2 norm of everything added so far (meaningful for one rank or after an all-reduce).
  double norm() const noexcept { return std::sqrt(sum_squares); }
};

// The norm types clip_grad_norm_ offers that zshard computes: 2, 1 and inf.
inline bool is_supported_norm_type(double t) noexcept { return t == 2.0 || t == 1.0 || (std::isinf(t) && t > 0); }

// One rank's part of a global L1 or L-inf norm over host gradients: the sum of |g| (type 1,
// in double; all-reduced with sum) or the largest |g| (type inf; all-reduced with max). The L2
// norm does not come through here: the Offloaders take its sum of squares on their fast path.
// NaN propagates (a NaN gradient must not vanish into max); the overflow flag is the L2 path's.
inline double norm_part(const float* g, std::size_t n, double norm_type) noexcept {
  if (norm_type == 1.0) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    const std::size_t body = n - n % 4;
    for (std::size_t i = 0; i < body; i += 4)
      for (std::size_t k = 0; k < 4; ++k) acc[k] += std::fabs(static_cast<double>(g[i + k]));
    for (std::size_t i = body; i < n; ++i) acc[0] += std::fabs(static_cast<double>(g[i]));
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  float mx = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(g[i]);
    if (std::isnan(a)) return a;
    if (a > mx) mx = a;
  }
  return mx;
}

// Combines two parts of the same norm type.
inline double combine_norm_parts(double a, double b, double norm_type) noexcept {
  if (norm_type == 1.0) return a + b;
  return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<double>::quiet_NaN() : (a > b ? a : b);
}

}  // namespace zshard::optim

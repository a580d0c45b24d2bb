#pragma once
// This rank's part of the step's global gradient norm, of type 2, 1 or inf
// (engine_config::clip_norm_type, as clip_grad_norm_'s norm_type), over the gradient shards it
// owns (a replicated parameter counts on rank 0 only for the sums; max is idempotent):
//   2    sum of squares (the Offloader's local_grad_stats, taken as gradients arrive)
//   1    sum of |g|, from the Offloader's local_grad_norm_part(1)
//   inf  max |g|, from local_grad_norm_part(inf)
// The Inf/NaN flag always comes from local_grad_stats. The parts travel in the step's single
// exchange (rank_agreement::at_step), with the schedule fingerprint: no second collective.
// The norm is of the accumulated (unscaled) gradient shards: the engine divides by micro-batches
// and the loss scale, which every norm type is homogeneous in.
#include <cmath>
#include <concepts>

#include "zshard/core/error.hpp"
#include "zshard/engine/rank_agreement.hpp"

namespace zshard {

// Whether an Offloader computes L1 / L-inf parts (both in-tree Offloaders do).
template <class O>
concept offloader_with_norm_types = requires(O& o, double t) {
  { o.local_grad_norm_part(t) } -> std::convertible_to<double>;
};

// At construction: a norm type the Offloader cannot compute is a configuration error then, not
// at the first step().
template <class Offloader>
void check_norm_type_supported(double norm_type) {
  if constexpr (!offloader_with_norm_types<Offloader>)
    ZSHARD_REQUIRE(norm_type == 2.0, error_kind::config, "this engine's Offloader computes only L2 gradient norms",
                   "set clip_norm_type = 2, or give the Offloader local_grad_norm_part(norm_type)");
}

template <class Offloader>
local_grad_norm local_grad_norm_of(Offloader& offloader, double norm_type) {
  const grad_stats stats = offloader.local_grad_stats();
  local_grad_norm out{stats.sum_squares, stats.nonfinite, norm_type};
  if (norm_type != 2.0) {
    if constexpr (offloader_with_norm_types<Offloader>)
      out.part = offloader.local_grad_norm_part(norm_type);
    else
      throw error(error_kind::config, "this engine's Offloader computes only L2 gradient norms",
                  "set clip_norm_type = 2, or give the Offloader local_grad_norm_part(norm_type)");
  }
  return out;
}

}  // namespace zshard

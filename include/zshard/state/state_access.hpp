#pragma once
// State access: what a rank holds of each parameter, read and written by element range from
// and into host memory — the one mechanism under checkpoints (save, load, resharding), loading
// pretrained weights, and tools that read or set a parameter's value or optimizer state.
//
// Fields of a parameter's shard on this rank (shard_layout: elements [0, shard_numel)):
//   working  the working copy the model computes with, in the parameter's dtype (every parameter)
//   master   the f32 master copy          } parameters with optimizer state only (trainable, or
//   m, v     AdamW's first/second moments } frozen with the state they kept), held by the
//                                           Offloader (device or host memory, whichever it uses)
// and per engine the run counters (optimizer step, learning rate, loss-scaler state) and each
// parameter's own AdamW update count (engine::update_counts / restore_update_counts).
//
// An Offloader that supports state access provides, for its f32 fields (host pointers, element
// offsets within p's shard; it orders the copies itself and returns when they are complete):
//   read_state(p, field, offset, float* dst, n)
//   write_state(p, field, offset, const float* src, n)
// The engine exposes read_shard/write_shard over all four fields and run_counters/
// restore_run_counters; all of them are per rank (not collective) and allowed only between
// steps: no scope open, no micro-batch since the last step (the Offloader's gradients are empty).
// After writing `master`, write `working` too (or derive it): the engine never re-derives one
// from the other outside step().
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zshard/model/model_spec.hpp"
#include "zshard/optim/loss_scaler.hpp"

namespace zshard {

enum class state_field : std::uint8_t { working, master, m, v };

constexpr std::string_view to_string(state_field f) noexcept {
  switch (f) {
    case state_field::working: return "working";
    case state_field::master: return "master";
    case state_field::m: return "m";
    case state_field::v: return "v";
  }
  return "?";
}

// The engine's counters a resumed run needs besides the parameters' state.
struct run_state {
  std::int64_t step = 0;  // optimizer steps taken (AdamW bias correction)
  float lr = 0.0f;        // current learning rate (after any schedule's set_lr)
  optim::loss_scaler_state scaler{};
};

template <class O>
concept state_accessible = requires(O& o, param_id p, state_field f, std::size_t offset, float* dst, const float* src,
                                    std::size_t n) {
  o.read_state(p, f, offset, dst, n);
  o.write_state(p, f, offset, src, n);
};

}  // namespace zshard

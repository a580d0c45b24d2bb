#pragma once
// HookTracker: the lifecycle of module uses within a step. It enforces invariants I1-I4 and
// tells the engine when a parameter's gradient is complete (so it can be reduced and released).
//
// Contract (the engine calls, in this order within a step):
//   reset(spec)                            once, binding the tracker to a model
//   on_forward(m, kind) -> counted?        every forward scope; I1: only `counted` uses are
//                                          counted (grad mode on, not a recompute)
//   on_begin_backward()
//   on_backward(m)                         entering m's backward; a usage error if m has no
//                                          counted use left (never forwarded, or already done)
//   on_backward_done(m, completed)         leaving m's backward; appends the trainable
//                                          parameters whose gradient is now complete (I2:
//                                          exactly once per use; counts never go negative)
//   on_end_backward(completed, swept)      I3: every use still pending is dropped and reported
//                                          in `swept`; its parameters are appended to `completed`
//   keeps_gathered(m) -> bool              asked after every scope of m closes: whether m's
//                                          parameters must stay gathered (a binding hold, unlike
//                                          a Prefetcher's advisory keep). The default holds a
//                                          recomputed module until its backward, which follows.
//                                          Holds end at end_backward whatever it says (I3).
//   on_step()                              I4: a violation of "nothing pending" is an error
// Phase rules: counted forwards outside backward; recompute only inside backward; no-grad
// forwards anywhere; step() never inside backward.
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/core/policy_tags.hpp"
#include "zshard/model/model_spec.hpp"

namespace zshard {

enum class use_kind : std::uint8_t {
  counted,    // a forward whose backward will run
  recompute,  // a checkpointed block's forward re-run during backward: gathers, never counts
  no_grad,    // evaluation, reference-model passes: gathers, never counts
};

constexpr std::string_view to_string(use_kind k) noexcept {
  switch (k) {
    case use_kind::counted: return "counted";
    case use_kind::recompute: return "recompute";
    case use_kind::no_grad: return "no_grad";
  }
  return "?";
}

enum class step_phase : std::uint8_t { forward, backward };

struct swept_use {
  module_id module;
  std::int64_t pending_uses;  // counted forwards whose backward never ran
};

template <class T>
concept hook_tracker =
    opts_into<T, hook_tracker_tag> &&
    requires(T& t, const T& ct, const model_spec& spec, module_id m, use_kind k, std::vector<param_id>& completed,
             std::vector<swept_use>& swept) {
      t.reset(spec);
      { t.on_forward(m, k) } -> std::same_as<bool>;
      t.on_begin_backward();
      t.on_backward(m);
      t.on_backward_done(m, completed);
      t.on_end_backward(completed, swept);
      t.on_step();
      { ct.keeps_gathered(m) } -> std::same_as<bool>;
      { ct.phase() } -> std::same_as<step_phase>;
      { ct.pending_uses(m) } -> std::convertible_to<std::int64_t>;
    };

template <class T>
constexpr bool check_hook_tracker() {
  static_assert(opts_into<T, hook_tracker_tag>,
                "zshard: a HookTracker declares `using zshard_tag = zshard::hook_tracker_tag;`");
  static_assert(hook_tracker<T>, "zshard: the type does not provide the HookTracker contract; see track/hook_tracker.hpp");
  return true;
}

}  // namespace zshard

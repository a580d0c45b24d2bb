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
//                                          parameters must stay gathered (a binding hold: never
//                                          evicted, so max_live_numel can fail on it). The
//                                          default holds nothing bindingly.
//   prefers_gathered(m) -> bool            optional, asked likewise: a preferred hold, kept while
//                                          the budget allows and evicted (then gathered again)
//                                          when a scope needs the room. The default prefers a
//                                          recomputed module until its backward, which follows.
//                                          Holds of both kinds end at end_backward (I3).
//   on_step()                              I4: a violation of "nothing pending" is an error
//   on_scope_failed(m, kind, backward)     optional: the scope just reported could not be opened
//                                          (live budget, allocation); undo its count so that the
//                                          engine stays usable and a retry counts once
//   on_set_trainable(p, trainable)         optional: engine::set_trainable changed p's flag in the
//                                          spec (between steps), for a tracker that keeps a copy
// Phase rules: counted forwards outside backward; recompute only inside backward; no-grad
// forwards anywhere; step() never inside backward.
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/core/policy_family.hpp"
#include "zshard/core/policy_tags.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/model/use_kind.hpp"

namespace zshard {

enum class step_phase : std::uint8_t { forward, backward };

struct swept_use {
  module_id module;
  std::int64_t pending_uses;  // counted forwards whose backward never ran
};

template <class T>
concept hook_tracker = requires(T& t, const T& ct, const model_spec& spec, module_id m, use_kind k,
                                std::vector<param_id>& completed, std::vector<swept_use>& swept) {
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

// A policy family that opted in (a structural match alone never counts) and whose
// implementation conforms.
template <class F, class B = any_backend, class C = any_comm>
concept hook_tracker_family = opts_into<F, hook_tracker_tag> && has_policy_impl<F, B, C> && hook_tracker<policy_impl_t<F, B, C>>;

// `static_assert(check_hook_tracker<my_tracker>());` next to a HookTracker's definition.
template <class Family, class Backend = any_backend, class Comm = any_comm>
constexpr bool check_hook_tracker() {
  ZSHARD_CHECK_POLICY_FAMILY(Family, Backend, Comm, hook_tracker_tag, "a HookTracker", "HookTracker");
  constexpr bool named = policy_named<Family, hook_tracker_tag, Backend, Comm>;
  static_assert(!named || hook_tracker<policy_impl_t<Family, Backend, Comm>>,
                "zshard: the HookTracker does not provide its contract (reset, on_forward -> bool, on_begin_backward, "
                "on_backward, on_backward_done, on_end_backward, on_step, keeps_gathered, phase, pending_uses); see "
                "track/hook_tracker.hpp");
  return true;
}

}  // namespace zshard

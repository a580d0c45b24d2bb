#pragma once
// Which plan holds for which policies. The planner replays the engine with its default
// Reducer (reduce::bucketed) and HookTracker (track::use_counter), lays parameters out with the
// Partitioner it is given, and for the other two policies needs to be told what the run uses:
//
//   Prefetcher            plan_options::prefetcher   the plan's gathered_params
//   prefetch::trace       trace (the default)        its decisions replayed; exact unless
//                                                    max_live_numel stops gathers ahead
//   prefetch::on_demand   on_demand                  exact
//   any other             any                        what open scopes and holds pin, plus
//                                                    max_live_numel filled with the widest
//                                                    parameters (all the engine lets any
//                                                    Prefetcher have; plan/gathered_bound.hpp)
//   Offloader             plan_options::optimizer
//   offload::on_device    device (the default)
//   offload::host_adam    host
//   any other             as given: say where its state lives
//
// options_for<Policies>() fills both in from a policies type, and plan_memory_for<Policies>()
// plans with its Partitioner and those options; it refuses, at compile time, a Reducer or
// HookTracker the planner does not replay (a plan for them would not bound the run).
#include <type_traits>

#include "zshard/core/policy_family.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/offload/on_device.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/prefetch/on_demand.hpp"
#include "zshard/prefetch/trace_prefetcher.hpp"
#include "zshard/reduce/bucketed.hpp"
#include "zshard/track/use_counter.hpp"

namespace zshard::plan {

namespace detail {
template <class Family>
using planned_impl = policy_impl_t<Family, any_backend, any_comm>;

template <class T>
inline constexpr bool is_host_adam = false;
template <class B, class C>
inline constexpr bool is_host_adam<offload::host_adam_impl<B, C>> = true;
template <class T>
inline constexpr bool is_on_device = false;
template <class B, class C>
inline constexpr bool is_on_device<offload::on_device_impl<B, C>> = true;
}  // namespace detail

// How the planner treats the Prefetcher family F (see the table above).
template <class F>
constexpr prefetch_policy prefetch_policy_of() noexcept {
  using impl = detail::planned_impl<F>;
  if constexpr (std::is_same_v<impl, prefetch::trace>)
    return prefetch_policy::trace;
  else if constexpr (std::is_same_v<impl, prefetch::on_demand>)
    return prefetch_policy::on_demand;
  else
    return prefetch_policy::any;
}

// `o` with its Prefetcher and Offloader entries set from Policies (other entries kept).
template <class Policies>
plan_options options_for(plan_options o = {}) {
  o.prefetcher = prefetch_policy_of<typename Policies::prefetcher>();
  using offloader = detail::planned_impl<typename Policies::offloader>;
  if constexpr (detail::is_host_adam<offloader>) o.optimizer = optimizer_location::host;
  if constexpr (detail::is_on_device<offloader>) o.optimizer = optimizer_location::device;
  return o;
}

// plan_memory for a run with these policies (any schedule form plan_memory takes).
template <class Policies, class Schedule>
memory_plan plan_memory_for(const model_spec& spec, const engine_config& cfg, int world, const Schedule& schedule,
                            const plan_options& opt = {}) {
  static_assert(std::is_same_v<detail::planned_impl<typename Policies::reducer>,
                               detail::planned_impl<reduce::bucketed>>,
                "zshard: the memory planner replays reduce::bucketed; a plan for another Reducer would not bound "
                "its run (plan with the default Reducer, or measure with run_phantom)");
  static_assert(std::is_same_v<detail::planned_impl<typename Policies::hook_tracker>, track::use_counter>,
                "zshard: the memory planner replays track::use_counter; a plan for another HookTracker would not "
                "bound its run (plan with the default HookTracker, or measure with run_phantom)");
  return plan_memory<detail::planned_impl<typename Policies::partitioner>>(spec, cfg, world, schedule,
                                                                         options_for<Policies>(opt));
}

}  // namespace zshard::plan

#pragma once
// The default policies with some swapped, named once for every test: a test that trains with
// the optimizer on the host says `test_support::host_offload_policies`, one with its own
// Prefetcher `test_support::with_prefetcher<my_prefetcher>` (a policy of a class template:
// test_support::family, impl_family.hpp).
#include "zshard/engine/default_policies.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/prefetch/on_demand.hpp"
#include "impl_family.hpp"

namespace test_support {

using defaults = zshard::default_policies;

template <class Partitioner = defaults::partitioner, class Prefetcher = defaults::prefetcher,
          class Reducer = defaults::reducer, class Offloader = defaults::offloader,
          class HookTracker = defaults::hook_tracker>
struct policies {
  using partitioner = Partitioner;
  using prefetcher = Prefetcher;
  using reducer = Reducer;
  using offloader = Offloader;
  using hook_tracker = HookTracker;
};

// One policy swapped.
template <class P> using with_partitioner = policies<P>;
template <class P> using with_prefetcher = policies<defaults::partitioner, P>;
template <class P> using with_reducer = policies<defaults::partitioner, defaults::prefetcher, P>;
template <class P> using with_offloader = policies<defaults::partitioner, defaults::prefetcher, defaults::reducer, P>;
template <class P>
using with_hook_tracker =
    policies<defaults::partitioner, defaults::prefetcher, defaults::reducer, defaults::offloader, P>;

// The optimizer state and update on the host (offload::host_adam).
using host_offload_policies = with_offloader<zshard::offload::host_adam>;
// Gathers when a scope opens, nothing ahead (prefetch::on_demand).
using on_demand_policies = with_prefetcher<zshard::prefetch::on_demand>;

}  // namespace test_support

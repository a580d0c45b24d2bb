#pragma once
// The defaults, spelled in one place. Swap any policy by deriving and naming another type:
//   struct my_policies : zshard::default_policies { using prefetcher = zshard::prefetch::on_demand; };
#include "zshard/offload/on_device.hpp"
#include "zshard/partition/even_partitioner.hpp"
#include "zshard/prefetch/on_demand.hpp"
#include "zshard/prefetch/trace_prefetcher.hpp"
#include "zshard/reduce/bucketed.hpp"
#include "zshard/track/use_counter.hpp"

namespace zshard {

struct default_policies {
  using partitioner = partition::even;
  using prefetcher = prefetch::trace;
  using reducer = reduce::bucketed;
  using offloader = offload::on_device;
  using hook_tracker = track::use_counter;
};

// The engine's first check on its Policies argument: it names all five policies (deriving from
// default_policies and overriding some is the usual way).
template <class P>
constexpr bool check_policies() {
  static_assert(requires {
    typename P::partitioner;
    typename P::prefetcher;
    typename P::reducer;
    typename P::offloader;
    typename P::hook_tracker;
  }, "zshard: Policies names partitioner, prefetcher, reducer, offloader and hook_tracker; derive it from "
     "zshard::default_policies and override the ones you change");
  return true;
}

}  // namespace zshard

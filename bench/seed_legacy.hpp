#pragma once
// The seed scenario's policies with one mechanism of the original failure each
// (tests/support/legacy/: the drifting use counter, the reset live count, the copying reducer):
// what bench/seed_70b measures and tests/plan/test_seed_70b bounds.
#include "../tests/support/legacy/legacy_prefetcher.hpp"
#include "../tests/support/legacy/legacy_reducer.hpp"
#include "../tests/support/legacy/legacy_tracker.hpp"
#include "seed_scenario.hpp"

namespace zshard_bench {

struct legacy_tracker_policies : seed_policies {
  using hook_tracker = legacy::tracker;
};
struct legacy_prefetch_policies : seed_policies {
  using prefetcher = legacy::prefetch_count;
};
struct legacy_reducer_policies : seed_policies {
  using reducer = legacy::copy_bucket;
};

}  // namespace zshard_bench

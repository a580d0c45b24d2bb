#pragma once
// The values that tune a Prefetcher and the engine's live budget (engine_config::prefetch).
#include <cstddef>

namespace zshard {

struct prefetch_config {
  std::size_t max_live_numel = 1'000'000'000;  // resident gathered elements, hard budget (I5)
  std::size_t prefetch_numel = 50'000'000;     // how far ahead of use to gather
  std::size_t max_reuse_distance = 0;          // keep a parameter if it is used again within this many elements
  // A single module larger than max_live_numel is a configuration error unless this is set,
  // in which case that module alone may exceed the budget while it executes (its scope is
  // open, nothing else gathered). When its scope closes, what would stay gathered above the
  // budget (kept for reuse, held until its backward) is released at once: with no scope open
  // the budget holds, and the module is gathered again at its next use.
  bool allow_oversized_module = false;
};

}  // namespace zshard

#pragma once
// The values that tune an Offloader keeping optimizer state on the host (offload::host_adam):
// `engine_config::offload`. Values, not template parameters, like every other size in zshard.
#include <cstddef>
#include <optional>
#include <string>

#include "zshard/core/error.hpp"
#include "zshard/optim/cpu_features.hpp"

namespace zshard {

struct offload_config {
  // Threads that run the host optimizer on each rank, the rank's own thread included (it works
  // too while it waits). 0: one per hardware thread. With several ranks in one process (thread
  // communicator) their pools share the cores, so give each rank cores / ranks.
  int host_threads = 0;
  // The host AdamW kernel: automatic picks the widest the CPU runs; others force one.
  optim::simd_path host_path = optim::simd_path::automatic;
  // Elements per work item of the optimizer and of gradient accumulation (rounded up to 32, a
  // cache line of the bf16 copy): large enough to amortise claiming an item, small enough to
  // balance threads and to pipeline device copies.
  std::size_t host_tile_numel = std::size_t{1} << 16;
  // Elements of each of the two page-locked staging halves that stream gradients from, and
  // working parameters to, a device (unused when the backend's memory is host memory).
  std::size_t host_staging_numel = std::size_t{1} << 22;
  // Hard budget of the host ledger (fp32 master, moments, gradient shards, staging).
  std::optional<std::size_t> host_budget_bytes;

  void validate() const {
    ZSHARD_REQUIRE(host_threads >= 0, error_kind::config,
                   "offload_config.host_threads = " + std::to_string(host_threads) + " is negative",
                   "use 0 for one thread per hardware thread, or a positive count");
    ZSHARD_REQUIRE(host_tile_numel > 0, error_kind::config, "offload_config.host_tile_numel must be positive",
                   "use a tile of a few ten thousand elements, e.g. 65536");
    ZSHARD_REQUIRE(host_staging_numel >= host_tile_numel, error_kind::config,
                   "offload_config.host_staging_numel = " + std::to_string(host_staging_numel) +
                       " is smaller than host_tile_numel = " + std::to_string(host_tile_numel),
                   "a staging half must hold at least one tile; use a few million elements");
  }
};

}  // namespace zshard

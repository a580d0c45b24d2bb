#pragma once
// The values that tune an Offloader keeping optimizer state on the host (offload::host_adam):
// `engine_config::offload`. Values, not template parameters, like every other size in zshard.
// They also say where the tiers beyond the device hold what (docs/DESIGN.md, "offload tiers"):
// the working shards of sharded parameters (`params`) and host_adam's master and moments
// (`optimizer_state`, in memory or in files under `nvme_path`).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "zshard/core/error.hpp"
#include "zshard/optim/cpu_features.hpp"

namespace zshard {

// Where a kind of state lives: the backend's device, host memory, or files (an NVMe drive).
enum class offload_tier : std::uint8_t { device, host, nvme };

constexpr std::string_view to_string(offload_tier t) noexcept {
  switch (t) {
    case offload_tier::device: return "device";
    case offload_tier::host: return "host";
    case offload_tier::nvme: return "nvme";
  }
  return "?";
}

// Bytes an Offloader moved between tiers (host_adam's traffic()): to the device (parameter
// uploads for gathers, working values through staging), to the host (gradient shards), and read
// from and written to its NVMe files by steps. The planner counts the same (memory_plan::moved).
struct tier_traffic {
  std::uint64_t to_device = 0, to_host = 0, disk_read = 0, disk_written = 0;
  tier_traffic operator-(const tier_traffic& o) const noexcept {
    return {to_device - o.to_device, to_host - o.to_host, disk_read - o.disk_read, disk_written - o.disk_written};
  }
  friend bool operator==(const tier_traffic&, const tier_traffic&) = default;
};

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
  // Hard budget of the host ledger (fp32 master, moments, gradient shards, staging, offloaded
  // parameter shards, NVMe chunk buffers).
  std::optional<std::size_t> host_budget_bytes;
  // Host memory page-locked (the backend's pinned(), CUDA) or pageable. Page-locked memory is
  // what lets device copies run asynchronously; pageable memory is not limited by
  // RLIMIT_MEMLOCK. Backends without page-locked memory always use pageable memory.
  bool pin_memory = true;

  // Where the working shards of sharded parameters live: on the device (default), or in host
  // memory, uploaded to the device for each gather (offload/param_tier.hpp; needs the host
  // Offloader, offload::host_adam). Replicated parameters stay on the device.
  offload_tier params = offload_tier::device;
  // Where host_adam keeps f32 master and AdamW moments: host memory (default), or files under
  // nvme_path, read and written chunk by chunk in each step (offload/nvme_state.hpp).
  offload_tier optimizer_state = offload_tier::host;
  // The directory of the state files (optimizer_state = nvme): one file per rank, created at
  // construction with its final size and removed with the engine.
  std::string nvme_path;
  // Elements of master, m and v per chunk (a multiple of 1024; 12 bytes each in a file, in a
  // chunk buffer), and the chunk buffers in host memory (at least 3: AdamW on chunk k while
  // k + 1 is read and k - 1 written).
  std::size_t nvme_chunk_numel = std::size_t{1} << 20;
  int nvme_buffer_count = 4;
  // Threads that read and write the state files, per rank.
  int nvme_io_threads = 2;

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
    ZSHARD_REQUIRE(params != offload_tier::nvme, error_kind::config,
                   "offload_config.params = nvme: parameter shards on NVMe are not implemented",
                   "use params = host (parameter shards in host memory) and optimizer_state = nvme");
    ZSHARD_REQUIRE(optimizer_state != offload_tier::device, error_kind::config,
                   "offload_config.optimizer_state = device: the host Offloader keeps state on the host or on NVMe",
                   "use offload::on_device for state on the device, or host / nvme here");
    if (optimizer_state != offload_tier::nvme) return;
    ZSHARD_REQUIRE(!nvme_path.empty(), error_kind::config, "offload_config.optimizer_state = nvme without nvme_path",
                   "set nvme_path to a directory on the drive that is to hold the optimizer state");
    ZSHARD_REQUIRE(nvme_chunk_numel >= 1024 && nvme_chunk_numel % 1024 == 0, error_kind::config,
                   "offload_config.nvme_chunk_numel = " + std::to_string(nvme_chunk_numel) +
                       " is not a positive multiple of 1024",
                   "use a multiple of 1024 elements (12 KiB in the file), e.g. 1048576 (12 MiB per chunk)");
    ZSHARD_REQUIRE(nvme_buffer_count >= 3, error_kind::config,
                   "offload_config.nvme_buffer_count = " + std::to_string(nvme_buffer_count) + " is below 3",
                   "AdamW runs on one chunk while the next is read and the previous written: use 3 or more");
    ZSHARD_REQUIRE(nvme_io_threads >= 1 && nvme_io_threads <= 64, error_kind::config,
                   "offload_config.nvme_io_threads = " + std::to_string(nvme_io_threads) + " is outside [1, 64]",
                   "use 1 to 4 threads per rank");
  }
};

}  // namespace zshard

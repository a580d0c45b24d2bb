#pragma once
// What a GPU holds that zshard's ledger never sees, so that a plan's `fits` answers for the
// whole device. Each term is a value you can set; `cuda_defaults()` are estimates with their
// sources, meant to be replaced by what you measure on your machine (nvidia-smi's per-process
// figure before and after each step of your own setup).
//
//   cuda_context_bytes           the CUDA context of the process on the device: driver state,
//                                loaded kernels (with lazy loading, CUDA_MODULE_LOADING=LAZY,
//                                the default since CUDA 12.2, only those used). Measured at a
//                                few hundred MiB on A100/H100 with CUDA 12; default 512 MiB.
//   nccl_bytes_per_communicator  NCCL's buffers: per channel and per peer, one buffer per
//                                protocol (Simple: NCCL_BUFFSIZE, 4 MiB by default; LL128
//                                about 4.5 MiB; LL 256 KiB; NCCL docs, "Environment
//                                Variables"). With 16-32 channels over NVLink and a ring's two
//                                peers that is a few hundred MiB; default 512 MiB. Lower it
//                                with NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS.
//   communicators                how many NCCL communicators the process creates (zshard's
//                                engine uses one, three under hybrid sharding: the world, the
//                                shard group and the replica group, which plan_memory adds; a
//                                tensor-parallel stack adds its own).
//   pool_granularity_bytes       the stream-ordered pool (cudaMallocAsync) maps physical memory
//                                in granules of the device's allocation granularity
//                                (cuMemGetAllocationGranularity, 2 MiB on current GPUs): the
//                                reserve is the ledger's peak rounded up to it.
//   fragmentation                extra reserve as a fraction of the ledger's peak: freed blocks
//                                of one size do not always serve a request of another. 5% by
//                                default, a figure in the range allocators report for
//                                training loops whose allocation sizes repeat every step.
//   workspace_bytes              the training stack's own device workspaces: cuBLAS/cuBLASLt
//                                (NVIDIA recommends 32 MiB per handle on Hopper), cuDNN,
//                                attention kernels. Default 256 MiB: a few handles and streams.
#include <cstddef>

namespace zshard::plan {

struct device_overheads {
  std::size_t cuda_context_bytes = 0;
  std::size_t nccl_bytes_per_communicator = 0;
  int communicators = 0;
  std::size_t pool_granularity_bytes = 0;
  double fragmentation = 0.0;
  std::size_t workspace_bytes = 0;

  // The host and phantom backends: nothing beyond the ledger.
  static device_overheads none() noexcept { return {}; }
  // A CUDA device driven by cuda_backend and nccl_comm (see above for each figure's source).
  static device_overheads cuda_defaults() noexcept {
    constexpr std::size_t mib = std::size_t{1} << 20;
    return {512 * mib, 512 * mib, 1, 2 * mib, 0.05, 256 * mib};
  }

  // The pool's reserve beyond the ledger's peak: fragmentation, then rounding to a granule.
  std::size_t pool_bytes(std::size_t ledger_peak) const noexcept {
    const auto with_margin = ledger_peak + static_cast<std::size_t>(fragmentation * double(ledger_peak));
    const std::size_t g = pool_granularity_bytes;
    const std::size_t reserved = g ? (with_margin + g - 1) / g * g : with_margin;
    return reserved - ledger_peak;
  }
  std::size_t nccl_bytes() const noexcept {
    return nccl_bytes_per_communicator * std::size_t(communicators > 0 ? communicators : 0);
  }
  // Every term together, for a ledger that peaks at `ledger_peak`.
  std::size_t total(std::size_t ledger_peak) const noexcept {
    return cuda_context_bytes + nccl_bytes() + pool_bytes(ledger_peak) + workspace_bytes;
  }
};

}  // namespace zshard::plan

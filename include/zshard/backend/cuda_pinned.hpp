#pragma once
// Page-locked (pinned) host memory with its own ledger: what offloaded optimizer state and
// host<->device staging live in, because only pinned memory lets cudaMemcpyAsync run truly
// asynchronously (and at full PCIe/NVLink-C2C speed). It has the allocate/deallocate/ledger
// shape of a backend's memory half, so zshard::buffer works on it:
//
//   buffer<cuda_pinned_memory> m(backend.pinned(), dtype::f32, n, mem_category::optimizer_state);
//
// cudaHostAlloc and cudaFreeHost are slow and cudaFreeHost synchronises the device: allocate
// pinned buffers once (at construction), never per step. Runtime API only: plain C++ may use it.
#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "zshard/backend/cuda_check.hpp"
#include "zshard/core/memory_ledger.hpp"

namespace zshard {

class cuda_pinned_memory {
 public:
  explicit cuda_pinned_memory(std::string name = "pinned_host", std::optional<std::size_t> budget_bytes = std::nullopt)
      : ledger_(std::move(name), budget_bytes) {}
  cuda_pinned_memory(const cuda_pinned_memory&) = delete;
  cuda_pinned_memory& operator=(const cuda_pinned_memory&) = delete;

  memory_ledger& ledger() noexcept { return ledger_; }
  const memory_ledger& ledger() const noexcept { return ledger_; }

  // Portable: usable with every device of the process, so one rank's staging can serve a
  // communicator on another device in single-process multi-GPU runs.
  void* allocate(std::size_t bytes, mem_category c) {
    if (bytes == 0) return nullptr;
    ledger_.charge(c, bytes);
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (status != cudaSuccess) {
      ledger_.release(c, bytes);
      (void)cudaGetLastError();
      throw cuda::make_error(status, "cudaHostAlloc(" + std::to_string(bytes) + " bytes for " +
                                         std::string(to_string(c)) + ", pinned host)",
                             "pinned memory is limited by RLIMIT_MEMLOCK and physical RAM; offload less or "
                             "raise the limit");
    }
    return p;
  }
  // Errors from cudaFreeHost cannot be thrown here (buffers free in destructors); the memory
  // is gone either way, so the ledger is released regardless.
  void deallocate(void* p, std::size_t bytes, mem_category c) noexcept {
    if (!p) return;
    (void)cudaFreeHost(p);
    ledger_.release(c, bytes);
  }

 private:
  memory_ledger ledger_;
};

}  // namespace zshard

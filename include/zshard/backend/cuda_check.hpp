#pragma once
// Checked CUDA runtime calls: a failed call becomes a zshard::error of kind `backend` whose
// message names the call and CUDA's own description, e.g.
//   "cudaMallocFromPoolAsync(1048576 bytes for gathered_params) failed: cudaErrorMemoryAllocation
//    (out of memory)".
// Runtime API only (no device code), so plain C++ translation units may include it.
#include <cuda_runtime_api.h>

#include <string>

#include "zshard/core/error.hpp"

namespace zshard::cuda {

// "cudaErrorX (description)": the name for grepping, the description for humans.
inline std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

inline error make_error(cudaError_t status, const std::string& call, const std::string& hint = {}) {
  std::string h = hint;
  if (h.empty() && status == cudaErrorMemoryAllocation)
    h = "the device is out of memory: lower max_live_numel / reduce_bucket_numel, or set a ledger budget to see "
        "which category grows";
  if (h.empty() && (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver))
    h = "no usable CUDA device: check nvidia-smi, CUDA_VISIBLE_DEVICES and the driver version";
  return error(error_kind::backend, call + " failed: " + describe(status), h);
}

// Throws unless status is cudaSuccess. `call` names what was called, with its key arguments.
inline void check(cudaError_t status, const std::string& call, const std::string& hint = {}) {
  if (status != cudaSuccess) throw make_error(status, call, hint);
}

// Makes `device` current for the calling thread if it is not already (cheap when it is):
// kernels launch on the current device, so every entry point that enqueues work calls this.
inline void ensure_device(int device) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
}

// Puts the calling thread's current device back when it leaves scope (cheap; errors ignored).
struct device_restorer {
  int device = -1;
  device_restorer() noexcept {
    if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  }
  ~device_restorer() {
    if (device >= 0) (void)cudaSetDevice(device);
  }
  device_restorer(const device_restorer&) = delete;
  device_restorer& operator=(const device_restorer&) = delete;
};

// How many CUDA devices this process can use, and why none when there are none (the message
// GPU tests print when they skip).
struct device_census {
  int count = 0;
  std::string reason;  // empty when count > 0
};

inline device_census count_devices() {
  device_census c;
  const cudaError_t status = cudaGetDeviceCount(&c.count);
  if (status != cudaSuccess) {
    c.count = 0;
    c.reason = "cudaGetDeviceCount: " + describe(status);
    if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice)
      c.reason += ": no NVIDIA GPU/driver visible to this process";
    (void)cudaGetLastError();  // clear it so a later runtime call does not report it again
  } else if (c.count == 0) {
    c.reason = "cudaGetDeviceCount: 0 devices";
  }
  return c;
}

}  // namespace zshard::cuda

// Checks one runtime call and names it in the error: ZSHARD_CUDA_CHECK(cudaStreamSynchronize(s)).
#define ZSHARD_CUDA_CHECK(call) ::zshard::cuda::check((call), #call)

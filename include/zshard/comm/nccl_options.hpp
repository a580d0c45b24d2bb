#pragma once
// The NCCL communicator's options and the helpers its calls share (types, ops, overlap, back-off).
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "zshard/comm/communicator.hpp"

namespace zshard {

enum class nccl_completion : std::uint8_t {
  wait,     // each collective returns once finished on the GPU (simplest; the host waits)
  enqueue,  // returns once enqueued: order later work by stream; synchronize() before host reads
};

struct nccl_options {
  std::chrono::milliseconds timeout{60'000};  // init, collectives, synchronize(), finalize
  nccl_completion completion = nccl_completion::wait;
  // When set (run_nccl_ranks sets it when a rank thread fails), a rank waiting on a collective
  // aborts at once instead of waiting out the timeout.
  const std::atomic<bool>* cancel = nullptr;
  // Set to true when this communicator fails or is aborted (run_nccl_ranks points it at the
  // flag every rank reads as `cancel`), so peers stop waiting for it at once.
  std::atomic<bool>* report_failure = nullptr;
};

namespace nccl_detail {
inline ncclDataType_t type_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return ncclFloat32;
    case dtype::bf16:
      return ncclBfloat16;
    case dtype::f16:
      return ncclFloat16;
  }
  return ncclFloat32;
}
inline ncclRedOp_t op_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::average:
      return ncclAvg;
    case reduce_op::max:
      return ncclMax;
  }
  return ncclSum;
}
inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}
// Busy-poll for the first ~2000 rounds (collectives take microseconds), then sleep briefly.
inline void back_off(int spins) {
  if (spins < 2000)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}
inline ncclConfig_t nonblocking_config() noexcept {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}
// A collective's call as its errors name it: "all_gather(count=n, bf16)".
inline std::string describe(const char* call, std::size_t count, dtype t) {
  return std::string(call) + "(count=" + std::to_string(count) + ", " + std::string(to_string(t)) + ")";
}
inline std::string describe(const char* call, std::size_t count, dtype t, reduce_op op) {
  return std::string(call) + "(count=" + std::to_string(count) + ", " + std::string(to_string(t)) + ", " +
         std::string(to_string(op)) + ")";
}
}  // namespace nccl_detail

}  // namespace zshard

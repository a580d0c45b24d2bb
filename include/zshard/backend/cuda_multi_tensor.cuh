#pragma once
// Multi-tensor kernels of the CUDA backend: AdamW, the sum of squares and zeroing over many
// tensors in one launch (up to multi_tensor_max of them, their descriptors passed by value as the kernel's
// parameters). A step of a 124M-parameter model has about 150 parameter shards; one launch per
// shard, plus a memset and a reduction's allocation, query and copy each, kept the host busier
// than the GPU for milliseconds per step (issue 24).
//
// Blocks are split among the tensors of a launch by their size alone, so a tensor is reduced
// the same way whatever it is batched with: results are deterministic, and equal to the
// single-tensor entry points (which are batches of one) bit for bit. Per element the AdamW is
// cuda_kernels.cuh's adamw_element: the reference's arithmetic.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "zshard/backend/backend.hpp"
#include "zshard/backend/cuda_kernels.cuh"

namespace zshard::cuda {

namespace kernels {

inline constexpr int multi_tensor_max = 24;  // descriptors of a launch stay well under 4 KB
inline constexpr unsigned multi_tensor_max_blocks = 2048;

// Blocks for a tensor of n elements: about 16 elements per thread, at least 1, at most 2048.
inline unsigned blocks_of(std::size_t n) {
  const std::size_t per_block = std::size_t(block_threads) * 16;
  return static_cast<unsigned>(std::clamp<std::size_t>((n + per_block - 1) / per_block, 1, multi_tensor_max_blocks));
}

// Which tensor block b of a launch works on: the t with first_block[t] <= b < first_block[t + 1].
__device__ __forceinline__ int tensor_of(const unsigned* first_block, int count, unsigned b) {
  int t = 0;
  while (t + 1 < count && b >= first_block[t + 1]) ++t;
  return t;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct sum_squares_args {
  const float* x[multi_tensor_max];
  std::size_t n[multi_tensor_max];
  unsigned first_block[multi_tensor_max + 1];
  int count;
};

// partial[b] = this block's share of its tensor's sum of squares (f64), a fixed tree per block.
__global__ void sum_squares_partial_kernel(sum_squares_args a, double* partial) {
  __shared__ double warps[block_threads / 32];
  const unsigned b = blockIdx.x;
  const int t = tensor_of(a.first_block, a.count, b);
  const float* x = a.x[t];
  const std::size_t n = a.n[t];
  const std::size_t first = std::size_t(b - a.first_block[t]) * blockDim.x + threadIdx.x;
  const std::size_t stride = std::size_t(a.first_block[t + 1] - a.first_block[t]) * blockDim.x;
  double acc = 0;
  std::size_t done = 0;
  if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
    const std::size_t quads = n / 4;
    const auto* x4 = reinterpret_cast<const float4*>(x);
    for (std::size_t q = first; q < quads; q += stride) {
      const float4 v = x4[q];
      acc += double(v.x) * double(v.x);
      acc += double(v.y) * double(v.y);
      acc += double(v.z) * double(v.z);
      acc += double(v.w) * double(v.w);
    }
    done = quads * 4;
  }
  for (std::size_t i = done + first; i < n; i += stride) acc += double(x[i]) * double(x[i]);
  acc = warp_sum(acc);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) sum += warps[w];
    partial[b] = sum;
  }
}

// out[t] = the sum of tensor t's partials, one warp per tensor.
__global__ void sum_squares_finish_kernel(sum_squares_args a, const double* partial, double* out) {
  const int t = blockIdx.x;
  double acc = 0;
  for (unsigned i = a.first_block[t] + threadIdx.x; i < a.first_block[t + 1]; i += 32) acc += partial[i];
  acc = warp_sum(acc);
  if (threadIdx.x == 0) out[t] = acc;
}

struct adamw_args {
  struct tensor {
    adamw_scalars s;
    float* master;
    float* m;
    float* v;
    float* grad;
    void* out;
    std::size_t n;
    bool vectorised;
  };
  tensor t[multi_tensor_max];
  unsigned first_block[multi_tensor_max + 1];
  int count;
  bool zero_grad;
};

template <class W>
__global__ void adamw_batch_kernel(adamw_args a) {
  const unsigned b = blockIdx.x;
  const int i = tensor_of(a.first_block, a.count, b);
  const auto& t = a.t[i];
  const std::size_t first = std::size_t(b - a.first_block[i]) * blockDim.x + threadIdx.x;
  const std::size_t stride = std::size_t(a.first_block[i + 1] - a.first_block[i]) * blockDim.x;
  adamw_range(t.s, t.master, t.m, t.v, t.grad, t.n, static_cast<W*>(t.out), t.vectorised, a.zero_grad, first, stride);
}

// Zeroes tensors of bytes[t] bytes: 16-byte stores where the tensor is 16-byte aligned, single
// bytes for the rest.
struct zero_args {
  void* p[multi_tensor_max];
  std::size_t bytes[multi_tensor_max];
  unsigned first_block[multi_tensor_max + 1];
  int count;
};
__global__ void zero_batch_kernel(zero_args a) {
  const unsigned b = blockIdx.x;
  const int t = tensor_of(a.first_block, a.count, b);
  auto* p = static_cast<unsigned char*>(a.p[t]);
  const std::size_t n = a.bytes[t];
  const std::size_t first = std::size_t(b - a.first_block[t]) * blockDim.x + threadIdx.x;
  const std::size_t stride = std::size_t(a.first_block[t + 1] - a.first_block[t]) * blockDim.x;
  std::size_t done = 0;
  if (reinterpret_cast<std::uintptr_t>(p) % 16 == 0) {
    const std::size_t quads = n / 16;
    for (std::size_t q = first; q < quads; q += stride) reinterpret_cast<uint4*>(p)[q] = make_uint4(0, 0, 0, 0);
    done = quads * 16;
  }
  for (std::size_t i = done + first; i < n; i += stride) p[i] = 0;
}

}  // namespace kernels

// Zeroes every p[i][0, bytes[i]), one launch per multi_tensor_max tensors (a backward scope's
// gradient buffers: one launch instead of a memset each).
inline cudaError_t zero_batch(std::span<void* const> p, std::span<const std::size_t> bytes, cudaStream_t stream) {
  for (std::size_t at = 0; at < p.size(); at += kernels::multi_tensor_max) {
    kernels::zero_args a{};
    for (std::size_t i = at; i < std::min(p.size(), at + kernels::multi_tensor_max); ++i) {
      if (bytes[i] == 0) continue;
      a.p[a.count] = p[i];
      a.bytes[a.count] = bytes[i];
      a.first_block[a.count + 1] = a.first_block[a.count] + kernels::blocks_of(bytes[i] / 16 + 1);
      ++a.count;
    }
    if (a.count == 0) continue;
    kernels::zero_batch_kernel<<<a.first_block[a.count], kernels::block_threads, 0, stream>>>(a);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// out[i] = sum of squares of x[i][0, n[i]) in f64 (device memory), for every i; `partial`
// (device memory, sum_squares_partials(n) doubles) holds the blocks' shares. Enqueued on
// `stream`, no host wait; one or two launches per multi_tensor_max tensors.
inline std::size_t sum_squares_partials(std::span<const std::size_t> n) {
  std::size_t blocks = 0;
  for (std::size_t k : n) blocks += kernels::blocks_of(k);
  return blocks;
}
inline cudaError_t sum_squares_batch(std::span<const float* const> x, std::span<const std::size_t> n, double* out,
                                     double* partial, cudaStream_t stream) {
  for (std::size_t at = 0; at < x.size(); at += kernels::multi_tensor_max) {
    kernels::sum_squares_args a{};
    a.count = int(std::min<std::size_t>(kernels::multi_tensor_max, x.size() - at));
    for (int t = 0; t < a.count; ++t) {
      a.x[t] = x[at + std::size_t(t)];
      a.n[t] = n[at + std::size_t(t)];
      a.first_block[t + 1] = a.first_block[t] + kernels::blocks_of(a.n[t]);
    }
    kernels::sum_squares_partial_kernel<<<a.first_block[a.count], kernels::block_threads, 0, stream>>>(a, partial);
    kernels::sum_squares_finish_kernel<<<unsigned(a.count), 32, 0, stream>>>(a, partial, out + at);
    partial += a.first_block[a.count];
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Each task as cuda::adamw would apply it; with zero_grad every gradient read is zeroed. Tasks
// are launched in order, up to multi_tensor_max per launch, a launch per run of tasks with the
// same working type.
inline cudaError_t adamw_batch(std::span<const adamw_task> tasks, bool zero_grad, cudaStream_t stream) {
  const auto key = [](const adamw_task& t) { return t.working_out ? int(t.working_type) : -1; };
  std::size_t at = 0;
  while (at < tasks.size()) {
    kernels::adamw_args a{};
    a.zero_grad = zero_grad;
    const int type = key(tasks[at]);
    while (at < tasks.size() && a.count < kernels::multi_tensor_max && key(tasks[at]) == type) {
      const adamw_task& t = tasks[at++];
      if (t.n == 0) continue;
      const std::size_t quad_bytes = t.working_out ? 4 * size_of(t.working_type) : 16;
      auto& d = a.t[a.count];
      d = {kernels::make_adamw_scalars(t.step), t.master, t.m, t.v, t.grad, t.working_out, t.n,
           kernels::aligned(t.master, 16) && kernels::aligned(t.m, 16) && kernels::aligned(t.v, 16) &&
               kernels::aligned(t.grad, 16) && (!t.working_out || kernels::aligned(t.working_out, quad_bytes))};
      a.first_block[a.count + 1] = a.first_block[a.count] + kernels::blocks_of(t.n / 4 + 1);
      ++a.count;
    }
    if (a.count == 0) continue;
    const unsigned blocks = a.first_block[a.count];
    if (type < 0) {
      kernels::adamw_batch_kernel<void><<<blocks, kernels::block_threads, 0, stream>>>(a);
    } else {
      kernels::visit_dtype(dtype(type), [&](auto w) {
        kernels::adamw_batch_kernel<decltype(w)><<<blocks, kernels::block_threads, 0, stream>>>(a);
      });
    }
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace zshard::cuda

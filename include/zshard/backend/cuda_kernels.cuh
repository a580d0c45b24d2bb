#pragma once
// Device kernels of the CUDA backend and their launchers, CUB-style: a launcher enqueues work
// on the stream it is given (always the last argument), never blocks the host, and returns a
// cudaError_t; cuda_backend turns a status into a zshard::error that names the call.
//
// Every kernel computes bit for bit what the host reference computes: the dtype conversions
// repeat core/dtype.hpp's integer arithmetic (so NaN payloads and f16 subnormals agree too),
// and AdamW spells each float operation with a round-to-nearest intrinsic (__fmul_rn, ...)
// so nvcc cannot fuse a multiply and an add into an FMA the host reference does not do.
#include <cuda/std/functional>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cub/device/device_reduce.cuh>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/system_error.h>

#include "zshard/core/dtype.hpp"
#include "zshard/optim/adamw.hpp"

namespace zshard::cuda {

namespace kernels {

// ---- element arithmetic, host and device ------------------------------------------------------
// The element functions below compile for the host too, so the host-side tests can hold their
// transcription of the reference to it on machines without a GPU. On the device each float
// operation is a round-to-nearest intrinsic, which nvcc never contracts into an FMA.
#if defined(__CUDA_ARCH__)
__host__ __device__ __forceinline__ std::uint32_t bits(float f) { return __float_as_uint(f); }
__host__ __device__ __forceinline__ float from_bits(std::uint32_t u) { return __uint_as_float(u); }
__host__ __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__host__ __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__host__ __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__host__ __device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__host__ __device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
#else
__host__ __device__ inline std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
__host__ __device__ inline float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
__host__ __device__ inline float mul(float a, float b) { return a * b; }
__host__ __device__ inline float add(float a, float b) { return a + b; }
__host__ __device__ inline float sub(float a, float b) { return a - b; }
__host__ __device__ inline float div(float a, float b) { return a / b; }
__host__ __device__ inline float sqrt_rn(float a) { return std::sqrt(a); }
#endif

// ---- element conversions, bit-identical to core/dtype.hpp -----------------------------------
__host__ __device__ __forceinline__ float to_f32(float x) { return x; }
__host__ __device__ __forceinline__ float to_f32(bf16 h) { return from_bits(std::uint32_t{h.bits} << 16); }
__host__ __device__ __forceinline__ float to_f32(f16 h) {
  const std::uint32_t sign = std::uint32_t{h.bits & 0x8000u} << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  const std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return from_bits(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float magnitude = mul(static_cast<float>(mant), 5.9604644775390625e-8f);
    return sign ? -magnitude : magnitude;
  }
  return from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

template <class T>
__host__ __device__ __forceinline__ T from_f32(float f);
template <>
__host__ __device__ __forceinline__ float from_f32<float>(float f) {
  return f;
}
template <>
__host__ __device__ __forceinline__ bf16 from_f32<bf16>(float f) {
  std::uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}
template <>
__host__ __device__ __forceinline__ f16 from_f32<f16>(float f) {
  const std::uint32_t u = bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t x = u & 0x7fffffffu;
  if (x > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu))};
  if (x >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (x < 0x38800000u) {
    if (x <= 0x33000000u) return f16{sign};
    const std::uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (x >> 23);
    std::uint32_t m = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    m += (rem > half || (rem == half && (m & 1u))) ? 1u : 0u;
    return f16{static_cast<std::uint16_t>(sign | m)};
  }
  std::uint32_t h = (x - 0x38000000u) >> 13;
  const std::uint32_t rem = x & 0x1fffu;
  h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
  return f16{static_cast<std::uint16_t>(sign | h)};
}

// ---- launch geometry ------------------------------------------------------------------------
inline constexpr unsigned block_threads = 256;
// Grid-stride loops: enough blocks to fill any current GPU several times over (an H200 holds
// 132 SMs x 8 such blocks), without launching millions of blocks for a billion elements.
inline constexpr std::size_t max_blocks = 4096;

inline unsigned grid_for(std::size_t items) {
  const std::size_t blocks = (items + block_threads - 1) / block_threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, max_blocks));
}

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

inline bool aligned(const void* p, std::size_t to) { return reinterpret_cast<std::uintptr_t>(p) % to == 0; }

// ---- kernels --------------------------------------------------------------------------------
// Four elements of a buffer of S as floats, from one vector load (16 bytes for f32, 8 for 16-bit).
template <class S>
__device__ __forceinline__ float4 load_quad(const S* in, std::size_t q) {
  if constexpr (std::is_same_v<S, float>) {
    return reinterpret_cast<const float4*>(in)[q];
  } else {
    const uint2 u = reinterpret_cast<const uint2*>(in)[q];
    return make_float4(to_f32(S{static_cast<std::uint16_t>(u.x & 0xffffu)}), to_f32(S{static_cast<std::uint16_t>(u.x >> 16)}),
                       to_f32(S{static_cast<std::uint16_t>(u.y & 0xffffu)}), to_f32(S{static_cast<std::uint16_t>(u.y >> 16)}));
  }
}


// dst += src; `quads` float4 groups when both are 16-byte aligned, then the scalar tail.
__global__ void add_into_kernel(float* __restrict__ dst, const float* __restrict__ src, std::size_t n,
                                bool vectorised) {
  std::size_t done = 0;
  if (vectorised) {
    const std::size_t quads = n / 4;
    auto* d4 = reinterpret_cast<float4*>(dst);
    const auto* s4 = reinterpret_cast<const float4*>(src);
    for (std::size_t i = first_index(); i < quads; i += grid_stride()) {
      float4 a = d4[i];
      const float4 b = s4[i];
      a.x += b.x;
      a.y += b.y;
      a.z += b.z;
      a.w += b.w;
      d4[i] = a;
    }
    done = quads * 4;
  }
  for (std::size_t i = done + first_index(); i < n; i += grid_stride()) dst[i] += src[i];
}

// The per-step scalars of optim::detail::adamw_loop, computed on the host by the same
// expressions, so the device sees exactly the values the reference uses.
struct adamw_scalars {
  float b1, one_minus_b1, b2, one_minus_b2, eps, grad_scale, decay, step_size, sqrt_bc2;
};

inline adamw_scalars make_adamw_scalars(const optim::adamw_step& s) {
  return {s.beta1,    1.0f - s.beta1, s.beta2,
          1.0f - s.beta2, s.eps,     s.grad_scale,
          1.0f - s.lr * s.weight_decay, s.lr / s.bias_correction1, std::sqrt(s.bias_correction2)};
}

// One element of AdamW, operation for operation as optim::detail::adamw_loop.
__host__ __device__ __forceinline__ float adamw_element(const adamw_scalars& s, float& master, float& m, float& v,
                                                        float grad) {
  const float g = mul(grad, s.grad_scale);
  const float mi = add(mul(s.b1, m), mul(s.one_minus_b1, g));
  const float vi = add(mul(s.b2, v), mul(mul(s.one_minus_b2, g), g));
  const float denom = add(div(sqrt_rn(vi), s.sqrt_bc2), s.eps);
  const float p = sub(mul(master, s.decay), div(mul(s.step_size, mi), denom));
  m = mi;
  v = vi;
  master = p;
  return p;
}

template <class W>
struct quad_of;  // four working elements, stored in one vector access
template <>
struct quad_of<float> {
  using type = float4;
};
template <>
struct quad_of<bf16> {
  using type = uint2;
};
template <>
struct quad_of<f16> {
  using type = uint2;
};

template <class W>
__device__ __forceinline__ void store_quad(W* out, std::size_t q, float a, float b, float c, float d) {
  if constexpr (std::is_same_v<W, float>) {
    reinterpret_cast<float4*>(out)[q] = make_float4(a, b, c, d);
  } else {
    const auto lo = std::uint32_t{from_f32<W>(a).bits} | (std::uint32_t{from_f32<W>(b).bits} << 16);
    const auto hi = std::uint32_t{from_f32<W>(c).bits} | (std::uint32_t{from_f32<W>(d).bits} << 16);
    reinterpret_cast<uint2*>(out)[q] = make_uint2(lo, hi);
  }
}

// Quads of four elements (one vector load, one vector store) when both pointers are aligned
// for them, then the scalar tail; unaligned pointers take the scalar loop throughout.
template <class S, class D>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ dst, std::size_t n, bool vectorised) {
  std::size_t done = 0;
  if (vectorised) {
    const std::size_t quads = n / 4;
    for (std::size_t q = first_index(); q < quads; q += grid_stride()) {
      const float4 f = load_quad(src, q);
      store_quad(dst, q, f.x, f.y, f.z, f.w);
    }
    done = quads * 4;
  }
  for (std::size_t i = done + first_index(); i < n; i += grid_stride()) dst[i] = from_f32<D>(to_f32(src[i]));
}

// Fused AdamW over elements [0, n) of one shard, by the threads `first, first + stride, ...`:
// reads master, m, v, grad once, writes master, m, v, (W not void) the working copy and, with
// zero_grad, zeros the gradient it read (the next step accumulates into it). master may alias
// out only when W is float, so neither is __restrict__.
template <class W>
__device__ __forceinline__ void adamw_range(const adamw_scalars& s, float* master, float* __restrict__ m,
                                            float* __restrict__ v, float* __restrict__ grad, std::size_t n, W* out,
                                            bool vectorised, bool zero_grad, std::size_t first, std::size_t stride) {
  std::size_t done = 0;
  if (vectorised) {
    const std::size_t quads = n / 4;
    auto* p4 = reinterpret_cast<float4*>(master);
    auto* m4 = reinterpret_cast<float4*>(m);
    auto* v4 = reinterpret_cast<float4*>(v);
    auto* g4 = reinterpret_cast<float4*>(grad);
    for (std::size_t q = first; q < quads; q += stride) {
      float4 p = p4[q], mm = m4[q], vv = v4[q];
      const float4 g = g4[q];
      adamw_element(s, p.x, mm.x, vv.x, g.x);
      adamw_element(s, p.y, mm.y, vv.y, g.y);
      adamw_element(s, p.z, mm.z, vv.z, g.z);
      adamw_element(s, p.w, mm.w, vv.w, g.w);
      p4[q] = p;
      m4[q] = mm;
      v4[q] = vv;
      if (zero_grad) g4[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if constexpr (!std::is_void_v<W>) store_quad(out, q, p.x, p.y, p.z, p.w);
    }
    done = quads * 4;
  }
  for (std::size_t i = done + first; i < n; i += stride) {
    const float p = adamw_element(s, master[i], m[i], v[i], grad[i]);
    if (zero_grad) grad[i] = 0.0f;
    if constexpr (!std::is_void_v<W>) out[i] = from_f32<W>(p);
  }
}

// One shard (the grad is read only: adamw_range never zeros it here).
template <class W>
__global__ void adamw_kernel(adamw_scalars s, float* master, float* __restrict__ m, float* __restrict__ v,
                             const float* __restrict__ grad, std::size_t n, W* out, bool vectorised) {
  adamw_range(s, master, m, v, const_cast<float*>(grad), n, out, vectorised, false, first_index(), grid_stride());
}

// x *= scale; raises *flag if an input or a result is not finite (the loss scaler's overflow
// check, folded into the unscale pass). Every writer stores the same 1, so the race is benign.
__global__ void scale_check_kernel(float* __restrict__ x, std::size_t n, float scale, unsigned* __restrict__ flag) {
  bool bad = false;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float y = mul(x[i], scale);
    bad = bad || !isfinite(x[i]) || !isfinite(y);
    x[i] = y;
  }
  if (bad) *flag = 1u;
}

struct abs_value {
  __host__ __device__ float operator()(float x) const { return fabsf(x); }
};
// max that propagates NaN (fmaxf would drop it, hiding a poisoned gradient).
struct max_keep_nan {
  __host__ __device__ float operator()(float a, float b) const { return (a != a || a > b) ? a : b; }
};

template <class F>
bool visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: f(float{}); return true;
    case dtype::bf16: f(bf16{}); return true;
    case dtype::f16: f(f16{}); return true;
  }
  return false;
}

}  // namespace kernels

// ---- launchers: enqueue on `stream`, return the launch status ------------------------------

// n elements from src_type to dst_type, rounding to nearest even; same types copy.
inline cudaError_t cast(const void* src, dtype src_type, void* dst, dtype dst_type, std::size_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (src_type == dst_type) return cudaMemcpyAsync(dst, src, n * size_of(src_type), cudaMemcpyDeviceToDevice, stream);
  kernels::visit_dtype(src_type, [&](auto s) {
    kernels::visit_dtype(dst_type, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      if constexpr (!std::is_same_v<S, D>) {
        const bool vec = kernels::aligned(src, 4 * sizeof(S)) && kernels::aligned(dst, 4 * sizeof(D));
        kernels::cast_kernel<<<kernels::grid_for(vec ? n / 4 + 1 : n), kernels::block_threads, 0, stream>>>(
            static_cast<const S*>(src), static_cast<D*>(dst), n, vec);
      }
    });
  });
  return cudaGetLastError();
}

// dst += src (f32).
inline cudaError_t add_into(float* dst, const float* src, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = kernels::aligned(dst, 16) && kernels::aligned(src, 16);
  kernels::add_into_kernel<<<kernels::grid_for(vec ? n / 4 + 1 : n), kernels::block_threads, 0, stream>>>(dst, src, n,
                                                                                                          vec);
  return cudaGetLastError();
}

// The fused AdamW step of optim::adamw_update_scalar on device memory: same arguments, same
// results bit for bit. working_out (may be null) receives the updated master in working_type.
inline cudaError_t adamw(const optim::adamw_step& step, float* master, float* m, float* v, const float* grad,
                         std::size_t n, void* working_out, dtype working_type, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const kernels::adamw_scalars s = kernels::make_adamw_scalars(step);
  const bool state_vec = kernels::aligned(master, 16) && kernels::aligned(m, 16) && kernels::aligned(v, 16) &&
                         kernels::aligned(grad, 16);
  const auto launch = [&](auto* out) {
    using W = std::remove_pointer_t<decltype(out)>;
    std::size_t quad_bytes = 16;
    if constexpr (!std::is_void_v<W>) quad_bytes = 4 * sizeof(W);
    const bool vec = state_vec && (out == nullptr || kernels::aligned(out, quad_bytes));
    kernels::adamw_kernel<W><<<kernels::grid_for(vec ? n / 4 + 1 : n), kernels::block_threads, 0, stream>>>(
        s, master, m, v, grad, n, out, vec);
  };
  if (working_out == nullptr) {
    launch(static_cast<void*>(nullptr));
  } else {
    kernels::visit_dtype(working_type, [&](auto w) { launch(static_cast<decltype(w)*>(working_out)); });
  }
  return cudaGetLastError();
}

// x *= scale over n f32 elements; *nonfinite_flag (device memory) is set to 1 when an input or
// a scaled value is Inf/NaN and left alone otherwise, so one flag can cover many tensors.
inline cudaError_t scale_and_check(float* x, std::size_t n, float scale, unsigned* nonfinite_flag,
                                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  kernels::scale_check_kernel<<<kernels::grid_for(n), kernels::block_threads, 0, stream>>>(x, n, scale,
                                                                                         nonfinite_flag);
  return cudaGetLastError();
}

// *out = max |x[i]| (NaN if any element is NaN); the amax that scaling to a narrow type needs.
inline cudaError_t max_abs(void* temp, std::size_t& temp_bytes, const float* x, std::size_t n, float* out,
                           cudaStream_t stream) {
  return cub::DeviceReduce::TransformReduce(temp, temp_bytes, x, out, n, kernels::max_keep_nan{},
                                            kernels::abs_value{}, 0.0f, stream);
}

// Sets n elements of type t to `value` (rounded to t once, on the host). Thrust is the natural
// tool for a typed fill; par_nosync keeps it from synchronising the stream.
inline cudaError_t fill(void* dst, dtype t, std::size_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  try {
    const auto policy = thrust::cuda::par_nosync.on(stream);
    if (t == dtype::f32) {
      thrust::fill_n(policy, static_cast<float*>(dst), n, value);
    } else {
      const std::uint16_t bits = t == dtype::bf16 ? to_bf16(value).bits : to_f16(value).bits;
      thrust::fill_n(policy, static_cast<std::uint16_t*>(dst), n, bits);
    }
  } catch (const thrust::system_error& e) {
    return static_cast<cudaError_t>(e.code().value());
  }
  return cudaGetLastError();
}

}  // namespace zshard::cuda

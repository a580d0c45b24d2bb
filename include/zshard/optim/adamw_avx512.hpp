#pragma once
// AdamW on 16 lanes (AVX-512F/BW/VL/DQ), with the working copy (f32, bf16 or f16) written in
// the same pass. Every function carries its own `target` attribute, so the program around it
// is compiled for the baseline ISA; call these only when path_supported(simd_path::avx512)
// (adamw_dispatch.hpp does). bf16 rounding is integer round-to-nearest-even with NaN kept
// quiet, exactly to_bf16; the *_native variants use VCVTNEPS2BF16 (avx512_bf16 CPUs), which
// differs from to_bf16 only by flushing f32 subnormals to zero (see adamw_simd_common.hpp).
// f16 uses VCVTPS2PH with round-to-nearest-even, exactly to_f16.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "zshard/core/dtype.hpp"
#include "zshard/optim/adamw_simd_common.hpp"
#include "zshard/optim/cpu_features.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>

// GCC 12 reports the self-initialised placeholder inside _mm512_undefined_ps() (used by the
// unmasked intrinsics) as maybe-uninitialized (GCC bug 105593, fixed in 12.3).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// nvcc's front end does not know `GCC unroll` (warning 1675) but hands it on to the host compiler,
// which applies it: only the warning goes.
#if defined(__CUDACC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#endif

#define ZSHARD_AVX512_ISA "avx512f,avx512bw,avx512vl,avx512dq"
#define ZSHARD_AVX512 __attribute__((target(ZSHARD_AVX512_ISA)))
#define ZSHARD_AVX512_INLINE __attribute__((target(ZSHARD_AVX512_ISA), always_inline)) inline
#define ZSHARD_AVX512_BF16 __attribute__((target(ZSHARD_AVX512_ISA ",avx512bf16")))

namespace zshard::optim::avx512 {

struct lanes {
  __m512 b1, one_minus_b1, b2, one_minus_b2, eps, grad_scale, decay, step_size, sqrt_bc2, inv_sqrt_bc2;
};

ZSHARD_AVX512_INLINE lanes broadcast(const simd::adamw_constants& c) {
  return {_mm512_set1_ps(c.b1),         _mm512_set1_ps(c.one_minus_b1), _mm512_set1_ps(c.b2),
          _mm512_set1_ps(c.one_minus_b2), _mm512_set1_ps(c.eps),        _mm512_set1_ps(c.grad_scale),
          _mm512_set1_ps(c.decay),      _mm512_set1_ps(c.step_size),    _mm512_set1_ps(c.sqrt_bc2),
          _mm512_set1_ps(c.inv_sqrt_bc2)};
}

// x / sqrt_bc2 correctly rounded, without a division (the divider is the single-thread limit:
// two divisions and a square root per vector). Markstein's correction: with r = RN(1/s), q0 =
// RN(x r) is within an ulp of x/s, the FMA residual e = x - q0 s is exact, and RN(q0 + e r) is
// the correctly rounded quotient for every finite x >= 0 here (x = sqrt(v) is 0 or at least
// 2^-75, far from subnormal results; verified exhaustively over those x for many s). Infinite x
// would make the residual NaN, so it keeps q0 (= inf, as the division gives).
ZSHARD_AVX512_INLINE __m512 div_by_sqrt_bc2(const lanes& k, __m512 x) {
  const __m512 q0 = _mm512_mul_ps(x, k.inv_sqrt_bc2);
  const __m512 e = _mm512_fnmadd_ps(q0, k.sqrt_bc2, x);
  const __m512 q1 = _mm512_fmadd_ps(e, k.inv_sqrt_bc2, q0);
  const __mmask16 inf = _mm512_cmp_ps_mask(x, _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ);
  return _mm512_mask_blend_ps(inf, q1, q0);
}

// An empty asm that claims to change x: the product is rounded to f32 and the compiler cannot
// fuse it into the following add (AVX-512F has FMA), so results match the reference's two
// roundings. Costs no instruction.
ZSHARD_AVX512_INLINE __m512 rounded(__m512 x) {
  __asm__("" : "+v"(x));
  return x;
}

// bf16 bits of 16 floats, as to_bf16: add 0x7fff plus the lowest kept bit (ties to even; an
// overflow carries into Inf), NaN made quiet with its sign and top payload kept.
ZSHARD_AVX512_INLINE __m256i to_bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded_bits = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  const __m512i quiet_nan = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded_bits, quiet_nan), 16));
}

ZSHARD_AVX512_INLINE __m256i to_f16_bits(__m512 x) {
  return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

__attribute__((target(ZSHARD_AVX512_ISA ",avx512bf16"), always_inline)) inline __m256i to_bf16_bits_native(__m512 x) {
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
}


template <class W>
ZSHARD_AVX512_INLINE void store(W* out, __m512 p) {
  if constexpr (std::is_same_v<W, float>) _mm512_storeu_ps(out, p);
  else if constexpr (std::is_same_v<W, bf16>) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), to_bf16_bits(p));
  else if constexpr (std::is_same_v<W, f16>) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), to_f16_bits(p));
}

// The first lanes of `mask` only (a tail): masked-off lanes are neither read nor written.
template <class W>
ZSHARD_AVX512_INLINE void store_masked(W* out, __mmask16 mask, __m512 p) {
  if constexpr (std::is_same_v<W, float>) _mm512_mask_storeu_ps(out, mask, p);
  else if constexpr (std::is_same_v<W, bf16>) _mm256_mask_storeu_epi16(out, mask, to_bf16_bits(p));
  else if constexpr (std::is_same_v<W, f16>) _mm256_mask_storeu_epi16(out, mask, to_f16_bits(p));
}
ZSHARD_AVX512_INLINE __mmask16 first_lanes(std::size_t n) { return __mmask16((1u << n) - 1u); }

// One vector of the update from loaded values, in the reference's operation order
// (adamw.hpp): updates m, v and the master in place (registers).
ZSHARD_AVX512_INLINE void update(const lanes& k, __m512& master, __m512& m, __m512& v, __m512 grad) {
  const __m512 g = _mm512_mul_ps(grad, k.grad_scale);
  m = _mm512_add_ps(rounded(_mm512_mul_ps(k.b1, m)), rounded(_mm512_mul_ps(k.one_minus_b1, g)));
  v = _mm512_add_ps(rounded(_mm512_mul_ps(k.b2, v)), rounded(_mm512_mul_ps(_mm512_mul_ps(k.one_minus_b2, g), g)));
  const __m512 denom = _mm512_add_ps(div_by_sqrt_bc2(k, _mm512_sqrt_ps(v)), k.eps);
  master = _mm512_sub_ps(rounded(_mm512_mul_ps(master, k.decay)), _mm512_div_ps(_mm512_mul_ps(k.step_size, m), denom));
}

// The last n < 16 elements, through update() on masked lanes (the others load zeros, which
// update() handles without a NaN, and are not stored). So an element gets the same bits
// whether it falls in a full vector or in the tail, whatever the flags the program is built
// with: a scalar tail compiled with FMA (-march=native) rounds differently, and then where a
// shard ends would decide an element's bits, and training would depend on the world size.
// Returns the updated master lanes, for the caller to store the working copy's first n.
ZSHARD_AVX512_INLINE __m512 update_tail(const lanes& k, float* master, float* m, float* v, const float* grad,
                                        std::size_t n) {
  const __mmask16 mask = first_lanes(n);
  __m512 p = _mm512_maskz_loadu_ps(mask, master), mo = _mm512_maskz_loadu_ps(mask, m),
         va = _mm512_maskz_loadu_ps(mask, v);
  update(k, p, mo, va, _mm512_maskz_loadu_ps(mask, grad));
  _mm512_mask_storeu_ps(m, mask, mo);
  _mm512_mask_storeu_ps(v, mask, va);
  _mm512_mask_storeu_ps(master, mask, p);
  return p;
}

// `span` vectors per iteration, software-pipelined by hand: every load of the group is issued
// before the first division, so the loads of later vectors are in flight while the divider
// works (one vector at a time left the core's window full of operations waiting on the divider
// and the memory streams idle: about 0.7 of the same-bytes ceiling at one thread). With
// Prefetch, the group also prefetches its four streams `ahead` bytes ahead (adamw_prefetch.hpp
// says when that pays); the prefetch changes no value, only when a line arrives.
inline constexpr std::size_t span = 4;
// Unrolled at every optimisation level (GCC's -O2 keeps these loops and moves the vectors
// through the stack), so the group's vectors stay in registers.
#define ZSHARD_UNROLL_SPAN _Pragma("GCC unroll 4")

// A read prefetch `bytes` past p. The address is formed as an integer: near the end of an
// array it lies past the end, where a prefetch may point (it never faults) but pointer
// arithmetic may not.
ZSHARD_AVX512_INLINE void prefetch_ahead(const float* p, std::size_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + bytes), _MM_HINT_T0);
}

template <bool Prefetch>
ZSHARD_AVX512_INLINE void load_group(float* master, float* m, float* v, const float* grad, __m512 (&p)[span],
                                     __m512 (&mo)[span], __m512 (&va)[span], __m512 (&g)[span],
                                     [[maybe_unused]] std::size_t ahead) {
  if constexpr (Prefetch) {
    ZSHARD_UNROLL_SPAN
    for (std::size_t j = 0; j < span; ++j) {
      prefetch_ahead(grad + 16 * j, ahead);
      prefetch_ahead(m + 16 * j, ahead);
      prefetch_ahead(v + 16 * j, ahead);
      prefetch_ahead(master + 16 * j, ahead);
    }
  }
  ZSHARD_UNROLL_SPAN
  for (std::size_t j = 0; j < span; ++j) {
    g[j] = _mm512_loadu_ps(grad + 16 * j);
    mo[j] = _mm512_loadu_ps(m + 16 * j);
    va[j] = _mm512_loadu_ps(v + 16 * j);
    p[j] = _mm512_loadu_ps(master + 16 * j);
  }
}

// Every whole group of the range; returns where the groups end. The caller picks Prefetch once
// per call, so the loop carries no test for it.
template <bool Prefetch, class W>
ZSHARD_AVX512_INLINE std::size_t update_groups(const lanes& k, float* master, float* m, float* v, const float* grad,
                                               std::size_t n, W* out, std::size_t ahead) {
  std::size_t i = 0;
  for (; i + 16 * span <= n; i += 16 * span) {
    __m512 p[span], mo[span], va[span], g[span];
    load_group<Prefetch>(master + i, m + i, v + i, grad + i, p, mo, va, g, ahead);
    ZSHARD_UNROLL_SPAN
    for (std::size_t j = 0; j < span; ++j) update(k, p[j], mo[j], va[j], g[j]);
    ZSHARD_UNROLL_SPAN
    for (std::size_t j = 0; j < span; ++j) {
      _mm512_storeu_ps(m + i + 16 * j, mo[j]);
      _mm512_storeu_ps(v + i + 16 * j, va[j]);
      _mm512_storeu_ps(master + i + 16 * j, p[j]);
      if constexpr (!std::is_void_v<W>) store(out + i + 16 * j, p[j]);
    }
  }
  return i;
}

// adamw_update_scalar's contract on 16 lanes: W is float, bf16, f16, or void (no write-back).
// prefetch_bytes: how far ahead each stream is prefetched, 0 = no software prefetch.
template <class W>
ZSHARD_AVX512 void adamw_update(const adamw_step& s, float* master, float* m, float* v, const float* grad,
                                std::size_t n, W* out, std::size_t prefetch_bytes) noexcept {
  const lanes k = broadcast(simd::adamw_constants(s));
  std::size_t i = prefetch_bytes == 0 ? update_groups<false>(k, master, m, v, grad, n, out, 0)
                                      : update_groups<true>(k, master, m, v, grad, n, out, prefetch_bytes);
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_loadu_ps(master + i), mo = _mm512_loadu_ps(m + i), va = _mm512_loadu_ps(v + i);
    update(k, p, mo, va, _mm512_loadu_ps(grad + i));
    _mm512_storeu_ps(m + i, mo);
    _mm512_storeu_ps(v + i, va);
    _mm512_storeu_ps(master + i, p);
    if constexpr (!std::is_void_v<W>) store(out + i, p);
  }
  if (i < n) {
    const __m512 p = update_tail(k, master + i, m + i, v + i, grad + i, n - i);
    if constexpr (!std::is_void_v<W>) store_masked(out + i, first_lanes(n - i), p);
  }
}

// update_groups with the bf16 copy through VCVTNEPS2BF16 (its own target, so its own loop).
template <bool Prefetch>
__attribute__((target(ZSHARD_AVX512_ISA ",avx512bf16"), always_inline)) inline std::size_t update_groups_bf16_native(
    const lanes& k, float* master, float* m, float* v, const float* grad, std::size_t n, bf16* out, std::size_t ahead) {
  std::size_t i = 0;
  for (; i + 16 * span <= n; i += 16 * span) {
    __m512 p[span], mo[span], va[span], g[span];
    load_group<Prefetch>(master + i, m + i, v + i, grad + i, p, mo, va, g, ahead);
    ZSHARD_UNROLL_SPAN
    for (std::size_t j = 0; j < span; ++j) update(k, p[j], mo[j], va[j], g[j]);
    ZSHARD_UNROLL_SPAN
    for (std::size_t j = 0; j < span; ++j) {
      _mm512_storeu_ps(m + i + 16 * j, mo[j]);
      _mm512_storeu_ps(v + i + 16 * j, va[j]);
      _mm512_storeu_ps(master + i + 16 * j, p[j]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16 * j), to_bf16_bits_native(p[j]));
    }
  }
  return i;
}

// The same with a bf16 working copy through VCVTNEPS2BF16 (avx512_bf16 CPUs only).
ZSHARD_AVX512_BF16 inline void adamw_update_bf16_native(const adamw_step& s, float* master, float* m, float* v,
                                                        const float* grad, std::size_t n, bf16* out,
                                                        std::size_t prefetch_bytes) noexcept {
  const lanes k = broadcast(simd::adamw_constants(s));
  std::size_t i = prefetch_bytes == 0
                      ? update_groups_bf16_native<false>(k, master, m, v, grad, n, out, 0)
                      : update_groups_bf16_native<true>(k, master, m, v, grad, n, out, prefetch_bytes);
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_loadu_ps(master + i), mo = _mm512_loadu_ps(m + i), va = _mm512_loadu_ps(v + i);
    update(k, p, mo, va, _mm512_loadu_ps(grad + i));
    _mm512_storeu_ps(m + i, mo);
    _mm512_storeu_ps(v + i, va);
    _mm512_storeu_ps(master + i, p);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16_bits_native(p));
  }
  if (i < n) {
    const __m512 p = update_tail(k, master + i, m + i, v + i, grad + i, n - i);
    _mm256_mask_storeu_epi16(out + i, first_lanes(n - i), to_bf16_bits_native(p));
  }
}

// f32 -> W over n elements, rounding as the fused kernels do (the unfused cast pass).
template <class W>
ZSHARD_AVX512 void convert(const float* src, W* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) store(dst + i, _mm512_loadu_ps(src + i));
  if (i < n) store_masked(dst + i, first_lanes(n - i), _mm512_maskz_loadu_ps(first_lanes(n - i), src + i));
}

ZSHARD_AVX512_BF16 inline void convert_bf16_native(const float* src, bf16* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), to_bf16_bits_native(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 mask = first_lanes(n - i);
    _mm256_mask_storeu_epi16(dst + i, mask, to_bf16_bits_native(_mm512_maskz_loadu_ps(mask, src + i)));
  }
}

}  // namespace zshard::optim::avx512

#undef ZSHARD_UNROLL_SPAN
#undef ZSHARD_AVX512_BF16
#undef ZSHARD_AVX512_INLINE
#undef ZSHARD_AVX512
#undef ZSHARD_AVX512_ISA
#if defined(__CUDACC__)
#pragma nv_diagnostic pop
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

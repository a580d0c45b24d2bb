#pragma once
// AdamW on 8 lanes (AVX2, F16C for f16), with the working copy written in the same pass. The
// functions carry their own `target` attribute (the program stays baseline x86-64); call them
// only when path_supported(simd_path::avx2). FMA is deliberately not enabled here: the kernel
// is bandwidth-bound, and without it the compiler cannot contract mul+add, so results equal
// the scalar reference bit for bit (adamw_simd_common.hpp). bf16 is integer round-to-nearest-
// even with quiet NaN (exactly to_bf16); f16 is VCVTPS2PH with round-to-nearest-even (exactly
// to_f16).
#include <cstddef>
#include <type_traits>

#include "zshard/core/dtype.hpp"
#include "zshard/optim/adamw_simd_common.hpp"
#include "zshard/optim/cpu_features.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>

#define ZSHARD_AVX2 __attribute__((target("avx2,f16c")))
#define ZSHARD_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace zshard::optim::avx2 {

struct lanes {
  __m256 b1, one_minus_b1, b2, one_minus_b2, eps, grad_scale, decay, step_size, sqrt_bc2;
};

ZSHARD_AVX2_INLINE lanes broadcast(const simd::adamw_constants& c) {
  return {_mm256_set1_ps(c.b1),         _mm256_set1_ps(c.one_minus_b1), _mm256_set1_ps(c.b2),
          _mm256_set1_ps(c.one_minus_b2), _mm256_set1_ps(c.eps),        _mm256_set1_ps(c.grad_scale),
          _mm256_set1_ps(c.decay),      _mm256_set1_ps(c.step_size),    _mm256_set1_ps(c.sqrt_bc2)};
}

// Pins a product to f32 before its add: needed when the whole program is built with -mfma
// (then this function has FMA too and the compiler could contract); free otherwise.
ZSHARD_AVX2_INLINE __m256 rounded(__m256 x) {
  __asm__("" : "+x"(x));
  return x;
}

ZSHARD_AVX2_INLINE __m256 update(const lanes& k, float* master, float* m, float* v, const float* grad) {
  const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad), k.grad_scale);
  const __m256 mi = _mm256_add_ps(rounded(_mm256_mul_ps(k.b1, _mm256_loadu_ps(m))), rounded(_mm256_mul_ps(k.one_minus_b1, g)));
  const __m256 vi = _mm256_add_ps(rounded(_mm256_mul_ps(k.b2, _mm256_loadu_ps(v))),
                                  rounded(_mm256_mul_ps(_mm256_mul_ps(k.one_minus_b2, g), g)));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), k.sqrt_bc2), k.eps);
  const __m256 p = _mm256_sub_ps(rounded(_mm256_mul_ps(_mm256_loadu_ps(master), k.decay)),
                                 _mm256_div_ps(_mm256_mul_ps(k.step_size, mi), denom));
  _mm256_storeu_ps(m, mi);
  _mm256_storeu_ps(v, vi);
  _mm256_storeu_ps(master, p);
  return p;
}

// bf16 bits of 8 floats, as to_bf16 (see adamw_avx512.hpp).
ZSHARD_AVX2_INLINE __m128i to_bf16_bits(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded_bits = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i quiet_nan = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i bits = _mm256_srli_epi32(_mm256_blendv_epi8(rounded_bits, quiet_nan, nan), 16);
  // Values are below 2^16 now, so the unsigned-saturating pack is a plain narrowing.
  return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}

ZSHARD_AVX2_INLINE __m128i to_f16_bits(__m256 x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

template <class W>
ZSHARD_AVX2_INLINE void store(W* out, __m256 p) {
  if constexpr (std::is_same_v<W, float>) _mm256_storeu_ps(out, p);
  else if constexpr (std::is_same_v<W, bf16>) _mm_storeu_si128(reinterpret_cast<__m128i*>(out), to_bf16_bits(p));
  else if constexpr (std::is_same_v<W, f16>) _mm_storeu_si128(reinterpret_cast<__m128i*>(out), to_f16_bits(p));
}

// Lanes [0, n) set (a tail of n < 8 elements): the mask AVX's masked loads and stores take.
ZSHARD_AVX2_INLINE __m256i first_lanes(std::size_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The first n < 8 lanes of p as W (16-bit types through a small buffer: AVX2 has no 16-bit
// masked store).
template <class W>
ZSHARD_AVX2_INLINE void store_first(W* out, std::size_t n, __m256 p) {
  if constexpr (std::is_same_v<W, float>) {
    _mm256_maskstore_ps(out, first_lanes(n), p);
  } else {
    alignas(16) W bits[8];
    store(bits, p);
    for (std::size_t j = 0; j < n; ++j) out[j] = bits[j];
  }
}

// The last n < 8 elements through update() on masked lanes (the others load zeros and are not
// stored): an element gets the same bits in the tail as in a full vector, whatever flags the
// program is built with (see adamw_avx512.hpp's update_tail). Returns the master lanes.
ZSHARD_AVX2_INLINE __m256 update_tail(const lanes& k, float* master, float* m, float* v, const float* grad,
                                      std::size_t n) {
  const __m256i mask = first_lanes(n);
  alignas(32) float p[8], mo[8], va[8], g[8];
  _mm256_store_ps(p, _mm256_maskload_ps(master, mask));
  _mm256_store_ps(mo, _mm256_maskload_ps(m, mask));
  _mm256_store_ps(va, _mm256_maskload_ps(v, mask));
  _mm256_store_ps(g, _mm256_maskload_ps(grad, mask));
  const __m256 out = update(k, p, mo, va, g);
  _mm256_maskstore_ps(m, mask, _mm256_load_ps(mo));
  _mm256_maskstore_ps(v, mask, _mm256_load_ps(va));
  _mm256_maskstore_ps(master, mask, out);
  return out;
}

// adamw_update_scalar's contract on 8 lanes: W is float, bf16, f16, or void (no write-back).
template <class W>
ZSHARD_AVX2 void adamw_update(const adamw_step& s, float* master, float* m, float* v, const float* grad,
                              std::size_t n, W* out) noexcept {
  const lanes k = broadcast(simd::adamw_constants(s));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 p = update(k, master + i, m + i, v + i, grad + i);
    if constexpr (!std::is_void_v<W>) store(out + i, p);
  }
  if (i < n) {
    const __m256 p = update_tail(k, master + i, m + i, v + i, grad + i, n - i);
    if constexpr (!std::is_void_v<W>) store_first(out + i, n - i, p);
  }
}

// f32 -> W over n elements (the unfused cast pass).
template <class W>
ZSHARD_AVX2 void convert(const float* src, W* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store(dst + i, _mm256_loadu_ps(src + i));
  if (i < n) store_first(dst + i, n - i, _mm256_maskload_ps(src + i, first_lanes(n - i)));
}

}  // namespace zshard::optim::avx2

#undef ZSHARD_AVX2_INLINE
#undef ZSHARD_AVX2
#endif

#pragma once
// A DeepSpeed-style CPU Adam kernel, written here from the published algorithm (DeepSpeed's
// cpu_adam Step_AVX: AVX-512, eight vectors per iteration, FMAs, the bias correction of the
// second moment as a multiplication by 1/sqrt(bc2)) so host_adam can compare zshard's kernel
// with the approach the field uses, on the same machine, tiles and threads, in the same run.
// Same formula as zshard's AdamW (decoupled decay first, then the Adam step), but rounded the
// way such kernels round (contracted FMAs, one division per vector): results agree with
// zshard's to a few ulp, not bit for bit, which is what zshard's stricter kernel pays for.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "zshard/optim/adamw.hpp"
#include "zshard/optim/adamw_simd_common.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// GCC 12 flags the placeholder inside the unmasked intrinsics (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace reference_adam {

#define REFERENCE_ADAM_ISA __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// zshard's per-step constants (the same betas, eps, scale and 1/sqrt(bc2)), and the two this
// kernel's FMAs take in another form: the decay as a product to add, the step size negated.
struct constants : zshard::optim::simd::adamw_constants {
  float decay_mul, neg_step_size;
  explicit constants(const zshard::optim::adamw_step& s) noexcept
      : adamw_constants(s), decay_mul(-s.lr * s.weight_decay), neg_step_size(-step_size) {}
};

// bf16 bits with round-to-nearest-even (what DeepSpeed's bf16 path does in integer arithmetic).
REFERENCE_ADAM_ISA inline __m256i bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16));
}

// n elements; out (bf16 bits) may be null: no write-back.
REFERENCE_ADAM_ISA inline void step(const constants& c, float* p, float* m, float* v, const float* g, std::size_t n,
                                    std::uint16_t* out) noexcept {
  constexpr std::size_t span = 8, width = 16;
  const __m512 b1 = _mm512_set1_ps(c.b1), omb1 = _mm512_set1_ps(c.one_minus_b1);
  const __m512 b2 = _mm512_set1_ps(c.b2), omb2 = _mm512_set1_ps(c.one_minus_b2);
  const __m512 eps = _mm512_set1_ps(c.eps), gs = _mm512_set1_ps(c.grad_scale);
  const __m512 wd = _mm512_set1_ps(c.decay_mul), step = _mm512_set1_ps(c.neg_step_size);
  const __m512 bc2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  std::size_t i = 0;
  for (; i + span * width <= n; i += span * width) {
    __m512 gr[span], mo[span], va[span], pa[span];
#pragma GCC unroll 8
    for (std::size_t k = 0; k < span; ++k) {
      const std::size_t j = i + k * width;
      gr[k] = _mm512_mul_ps(_mm512_loadu_ps(g + j), gs);
      mo[k] = _mm512_loadu_ps(m + j);
      va[k] = _mm512_loadu_ps(v + j);
      pa[k] = _mm512_loadu_ps(p + j);
    }
#pragma GCC unroll 8
    for (std::size_t k = 0; k < span; ++k) {
      mo[k] = _mm512_fmadd_ps(mo[k], b1, _mm512_mul_ps(gr[k], omb1));
      va[k] = _mm512_fmadd_ps(va[k], b2, _mm512_mul_ps(_mm512_mul_ps(gr[k], gr[k]), omb2));
      const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(va[k]), bc2, eps);
      pa[k] = _mm512_fmadd_ps(pa[k], wd, pa[k]);
      pa[k] = _mm512_fmadd_ps(_mm512_div_ps(mo[k], denom), step, pa[k]);
    }
#pragma GCC unroll 8
    for (std::size_t k = 0; k < span; ++k) {
      const std::size_t j = i + k * width;
      _mm512_storeu_ps(m + j, mo[k]);
      _mm512_storeu_ps(v + j, va[k]);
      _mm512_storeu_ps(p + j, pa[k]);
      if (out) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), bf16_bits(pa[k]));
    }
  }
  for (; i < n; ++i) {  // scalar tail, the same arithmetic
    const float gi = g[i] * c.grad_scale;
    m[i] = std::fma(m[i], c.b1, gi * c.one_minus_b1);
    v[i] = std::fma(v[i], c.b2, gi * gi * c.one_minus_b2);
    const float denom = std::fma(std::sqrt(v[i]), c.inv_sqrt_bc2, c.eps);
    p[i] = std::fma(p[i], c.decay_mul, p[i]);
    p[i] = std::fma(m[i] / denom, c.neg_step_size, p[i]);
    if (out) {
      std::uint32_t u;
      std::memcpy(&u, &p[i], 4);
      out[i] = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
}

#undef REFERENCE_ADAM_ISA

}  // namespace reference_adam
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

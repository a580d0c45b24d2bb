#pragma once
// What the AVX2 and AVX-512 AdamW kernels share with the scalar reference, so that all paths
// compute the same numbers: the per-step constants (derived exactly as adamw_loop derives
// them) and the cast pass's scalar fallback.
//
// Equality with the reference. The vector kernels perform the reference's operations in the
// reference's order (IEEE mul, add, div and sqrt are correctly rounded on every path), and
// each product is pinned to a register before it is added so the compiler cannot contract it
// into an FMA, which rounds once instead of twice. Results are therefore bitwise equal to
// adamw_update_scalar compiled for baseline x86-64. Two documented exceptions:
//  - a program built with FMA enabled (-mfma, -march=native) lets the compiler contract the
//    *scalar reference* itself; then paths differ by a few ulp per step (tests allow 4 ulp of
//    the largest term per step when __FMA__ is defined);
//  - the avx512_bf16 path's conversion instruction (VCVTNEPS2BF16) flushes f32 subnormals
//    (|p| < 2^-126) to a signed zero where to_bf16 rounds them; master weights that small
//    do not occur in practice, and the f32 master itself is still bitwise equal.
// Within one path, every build: the elements after the last full vector run through the same
// vector code on masked lanes (never through the scalar reference), so an element's bits do
// not depend on where in the array it sits, and so not on where a shard or a tile ends:
// training is bitwise the same for every world size (tests/native/ checks it in a native build).
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "zshard/core/dtype.hpp"
#include "zshard/optim/adamw.hpp"

namespace zshard::optim::simd {

struct adamw_constants {
  float b1, one_minus_b1, b2, one_minus_b2, eps, grad_scale, decay, step_size, sqrt_bc2;
  float inv_sqrt_bc2;  // RN(1 / sqrt_bc2): what lets a kernel divide by sqrt_bc2 exactly without a division

  explicit adamw_constants(const adamw_step& s) noexcept
      : b1(s.beta1),
        one_minus_b1(1.0f - s.beta1),
        b2(s.beta2),
        one_minus_b2(1.0f - s.beta2),
        eps(s.eps),
        grad_scale(s.grad_scale),
        decay(1.0f - s.lr * s.weight_decay),
        step_size(s.lr / s.bias_correction1),
        sqrt_bc2(std::sqrt(s.bias_correction2)),
        inv_sqrt_bc2(1.0f / sqrt_bc2) {}
};

template <class W>
void convert_tail(const float* src, W* dst, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<W, float>) dst[i] = src[i];
    else if constexpr (std::is_same_v<W, bf16>) dst[i] = to_bf16(src[i]);
    else dst[i] = to_f16(src[i]);
  }
}

// Offsets a working-copy pointer; void (no write-back) stays null.
template <class W>
W* advance(W* out, std::size_t i) noexcept {
  if constexpr (std::is_void_v<W>) return out;
  else return out + i;
}

}  // namespace zshard::optim::simd

#pragma once
// The GPT's non-matmul math, one element or one row at a time, written once for the host and
// the GPU: under nvcc every function is __host__ __device__, under a plain C++ compiler it is
// ordinary inline code. The CUDA kernels (cuda/cuda_ops.cu) are thin launches that map threads
// to these functions; the host implementation of the same operations (host_ops.hpp) loops over
// them; the CPU tests hold them to the Eigen layers (gpt_layers.hpp), in float64 where that
// reference is templated. Each formula repeats the host layer's order of operations, so the
// two differ only where a reduction adds in another order or the compiler contracts a*b+c.
//
// Storage types: `float` and zshard::bf16 (16 bits of an f32, rounded to nearest even). GEMM
// operands are stored in the "half" type (bf16 on the GPU); everything else is f32.
#include <math.h>

#include <cstdint>
#include <cstring>

#include "zshard/core/dtype.hpp"

#if defined(__CUDACC__)
#define GPT_HD __host__ __device__ __forceinline__
#else
#define GPT_HD inline
#endif

namespace gpt::math {

// ---- storage conversions (core/dtype.hpp's arithmetic, usable in device code) ---------------
GPT_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
GPT_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

GPT_HD float load(float x) { return x; }
GPT_HD float load(zshard::bf16 h) { return bits_float(std::uint32_t{h.bits} << 16); }

template <class T>
GPT_HD T store(float f);
template <>
GPT_HD float store<float>(float f) {
  return f;
}
// Round to nearest even, NaN kept quiet: zshard::to_bf16 bit for bit.
template <>
GPT_HD zshard::bf16 store<zshard::bf16>(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return zshard::bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return zshard::bf16{static_cast<std::uint16_t>(u >> 16)};
}

// ---- layer norm (layers::layer_norm_stats / _apply / _backward) ------------------------------
inline constexpr float layer_norm_eps = 1e-5f;

// 1 / sqrt(var + eps) with var = (sum of squared deviations) / d, as the host computes it.
GPT_HD float layer_norm_rstd(float sum_sq_dev, int d) {
  const float var = sum_sq_dev / static_cast<float>(d);
  return 1.0f / sqrtf(var + layer_norm_eps);
}
GPT_HD float layer_norm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
GPT_HD float layer_norm_out(float xhat, float gain, float bias) { return xhat * gain + bias; }
// dx += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy * gain.
GPT_HD float layer_norm_dx(float dxhat, float xhat, float rstd, float mean_dxhat, float mean_dxhat_xhat) {
  return rstd * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
}

// ---- GELU, tanh form through the logistic function (layers::gelu_forward / _backward) -------
inline constexpr float gelu_c = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float gelu_a = 0.044715f;

// sigma = 1 / (1 + E), sigma_c = 1 - sigma = E sigma, E = exp(min(-2 c (x + a x^3), 80)).
GPT_HD void gelu_sigmoid(float x, float& sigma, float& sigma_c) {
  const float e = expf(fminf(-2.0f * gelu_c * (x + gelu_a * (x * x * x)), 80.0f));
  sigma = 1.0f / (1.0f + e);
  sigma_c = e * sigma;
}
GPT_HD float gelu_forward(float x) {
  float s, sc;
  gelu_sigmoid(x, s, sc);
  return x * s;
}
// dy * gelu'(x).
GPT_HD float gelu_backward(float x, float dy) {
  float s, sc;
  gelu_sigmoid(x, s, sc);
  return dy * (s + 2.0f * gelu_c * s * sc * (1.0f + 3.0f * gelu_a * (x * x)) * x);
}

// ---- softmax backward over one row of attention scores (layers::causal_attention_backward) ---
// ds_j = p_j (dp_j - <p, dp>) scale; the fused attention (attention_math.hpp) gets <p, dp> as
// <dout, out> of the row.
GPT_HD float softmax_grad(float p, float dp, float dot, float scale) { return p * (dp - dot) * scale; }

// ---- softmax cross-entropy over one row of logits (cross_entropy_forward / _backward) -------
// loss = log(sum) + max - logit[target]; dlogit_j = p_j w - (j == target) w, w = scale / rows.
GPT_HD float cross_entropy_loss(float sum_exp, float row_max, float target_logit) {
  return logf(sum_exp) + row_max - target_logit;
}
GPT_HD float cross_entropy_grad(float logit, float row_max, float sum_exp, float w, bool is_target) {
  const float g = (expf(logit - row_max) / sum_exp) * w;
  return is_target ? g - w : g;
}

// ---- the attention's shape: [B*T, d] rows, head h at columns h head_dim of each ---------------
struct head_layout {
  int batch, seq, heads, head_dim;
  GPT_HD int d_model() const { return heads * head_dim; }
};

}  // namespace gpt::math

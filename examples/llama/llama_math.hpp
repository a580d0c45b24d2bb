#pragma once
// The Llama's element- and row-wise math that the GPT does not have (RMSNorm, rotary position
// embedding, SwiGLU), written once for the host and a GPU as gpt_math.hpp is: under nvcc each
// function is __host__ __device__. Each follows transformers' LlamaForCausalLM in f32, in its
// order of operations where that is cheap to keep:
//   RMSNorm   y = w * (x * rsqrt(mean(x^2) + eps))
//   RoPE      on each pair (x1, x2) = (x[e], x[e + hd/2]) of a head at position t, angle t * inv_freq[e]:
//             (x1 cos - x2 sin, x2 cos + x1 sin)   (transformers: x cos + rotate_half(x) sin,
//             rotate_half(x) = cat(-x2, x1))
//   SwiGLU    down(silu(gate(x)) * up(x)), silu(g) = g / (1 + exp(-g))
#include <math.h>

#include "../gpt/gpt_math.hpp"

namespace llama::math {

// ---- RMSNorm --------------------------------------------------------------------------------
GPT_HD float rms_norm_rstd(float sum_sq, int d, float eps) { return 1.0f / sqrtf(sum_sq / static_cast<float>(d) + eps); }
GPT_HD float rms_norm_out(float x, float rstd, float gain) { return gain * (x * rstd); }
// dx = rstd (g - x rstd^2 mean(g x)), g = dy * gain: y = w x r with r = (mean(x^2) + eps)^-1/2,
// dr/dx_k = -r^3 x_k / d.
GPT_HD float rms_norm_dx(float g, float x, float rstd, float mean_gx) { return rstd * (g - x * (rstd * rstd) * mean_gx); }

// ---- rotary position embedding ----------------------------------------------------------------
GPT_HD void rope_rotate(float x1, float x2, float c, float s, float& y1, float& y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}
// The transpose (a rotation by the opposite angle): the gradient of rope_rotate's inputs.
GPT_HD void rope_unrotate(float dy1, float dy2, float c, float s, float& dx1, float& dx2) {
  dx1 = dy1 * c + dy2 * s;
  dx2 = dy2 * c - dy1 * s;
}

// ---- SwiGLU ---------------------------------------------------------------------------------
GPT_HD float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }
GPT_HD float silu(float g) { return g / (1.0f + expf(-g)); }  // torch's silu
GPT_HD float swiglu_forward(float g, float u) { return silu(g) * u; }
// d/dg [silu(g) u] = u sigma (1 + g (1 - sigma)); d/du = silu(g).
GPT_HD void swiglu_backward(float g, float u, float da, float& dg, float& du) {
  const float s = sigmoid(g);
  dg = da * u * (s * (1.0f + g * (1.0f - s)));
  du = da * (g * s);
}

}  // namespace llama::math

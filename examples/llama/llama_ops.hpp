#pragma once
// The operations the Llama (llama_model.hpp) needs beyond the GPT's (gpt/ops_contract.hpp), and
// their host implementation. A Llama Ops is a GPT Ops (gemm, embed_forward/backward, the fused
// causal attention_forward / attention_backward_prepare / attention_backward, residual_add,
// to_half, cross_entropy, zero, upload, download, ...) that also provides:
//   rms_norm_forward(x, gain, y, rstd, rows, d, eps)          y half_t = gain * x * rstd
//   rms_norm_backward(dy, x, rstd, gain, dx, rows, d)         dx += RMSNorm'(dy)
//   rms_norm_param_grad(dy, x, rstd, dgain, rows, d)          dgain += column sums of dy * x * rstd
//   qkv_rope_forward(q, k, v, cos, sin, qkv, layout, kv_heads)
//       q [N, H hd], k and v [N, KV hd] f32 -> qkv [N, 3 H hd] half_t as the GPT's attention reads
//       it (q | k | v, head h at columns h hd): q and k rotated (RoPE), k and v repeated so that
//       query head h meets key/value head h / (H / KV) (transformers' repeat_kv)
//   qkv_rope_backward(dqkv, cos, sin, dq, dk, dv, layout, kv_heads)
//       the transpose: dqkv [N, 3 H hd] f32 -> dq [N, H hd], dk and dv [N, KV hd] half_t, the
//       repeated heads' gradients summed in head order, q's and k's rotated back
//   swiglu_forward(gate, up, act, n)                          act half_t = silu(gate) * up
//   swiglu_backward(gate, up, dact, dgate, dup, n)            the two halves' gradients, half_t
// `layout` is the query heads' (B, T, H, hd); cos and sin are f32 [T, hd / 2]: entry (t, e) of
// the angle t * inv_freq[e]. A GPU follows by implementing these on llama_math.hpp's
// functions, as cuda/cuda_ops.cu does gpt_math.hpp's.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../gpt/host_ops.hpp"
#include "llama_math.hpp"

namespace llama {

template <class H>
class host_llama_ops : public gpt::host_ops<H> {
 public:
  using half_t = H;

  void rms_norm_forward(const float* x, const H* gain, H* y, float* rstd, int rows, int d, float eps) {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + std::size_t(r) * d;
      float ss = 0;
      for (int j = 0; j < d; ++j) ss += xr[j] * xr[j];
      rstd[r] = math::rms_norm_rstd(ss, d, eps);
      for (int j = 0; j < d; ++j)
        y[std::size_t(r) * d + j] = gpt::math::store<H>(math::rms_norm_out(xr[j], rstd[r], gpt::math::load(gain[j])));
    }
  }
  void rms_norm_backward(const float* dy, const float* x, const float* rstd, const H* gain, float* dx, int rows, int d) {
    for (int r = 0; r < rows; ++r) {
      const float* dyr = dy + std::size_t(r) * d;
      const float* xr = x + std::size_t(r) * d;
      float s = 0;
      for (int j = 0; j < d; ++j) s += dyr[j] * gpt::math::load(gain[j]) * xr[j];
      const float mean_gx = s / float(d);
      for (int j = 0; j < d; ++j)
        dx[std::size_t(r) * d + j] += math::rms_norm_dx(dyr[j] * gpt::math::load(gain[j]), xr[j], rstd[r], mean_gx);
    }
  }
  void rms_norm_param_grad(const float* dy, const float* x, const float* rstd, float* dgain, int rows, int d) {
    for (int j = 0; j < d; ++j) {
      float acc = 0;
      for (int r = 0; r < rows; ++r) acc += dy[std::size_t(r) * d + j] * (x[std::size_t(r) * d + j] * rstd[r]);
      dgain[j] += acc;
    }
  }

  void qkv_rope_forward(const float* q, const float* k, const float* v, const float* cos, const float* sin, H* qkv,
                        const gpt::math::head_layout& hl, int kv_heads) {
    const std::size_t hd = std::size_t(hl.head_dim), half = hd / 2, qd = std::size_t(hl.d_model()),
                      kvd = std::size_t(kv_heads) * hd, group = std::size_t(hl.heads / kv_heads);
    for (std::size_t r = 0; r < std::size_t(hl.batch) * std::size_t(hl.seq); ++r) {
      const float* c = cos + (r % std::size_t(hl.seq)) * half;
      const float* s = sin + (r % std::size_t(hl.seq)) * half;
      H* row = qkv + r * 3 * qd;
      for (std::size_t h = 0; h < std::size_t(hl.heads); ++h) {
        const float* qh = q + r * qd + h * hd;
        const float* kh = k + r * kvd + (h / group) * hd;
        const float* vh = v + r * kvd + (h / group) * hd;
        for (std::size_t e = 0; e < half; ++e) {
          float y1, y2;
          math::rope_rotate(qh[e], qh[e + half], c[e], s[e], y1, y2);
          row[h * hd + e] = gpt::math::store<H>(y1);
          row[h * hd + e + half] = gpt::math::store<H>(y2);
          math::rope_rotate(kh[e], kh[e + half], c[e], s[e], y1, y2);
          row[qd + h * hd + e] = gpt::math::store<H>(y1);
          row[qd + h * hd + e + half] = gpt::math::store<H>(y2);
        }
        for (std::size_t e = 0; e < hd; ++e) row[2 * qd + h * hd + e] = gpt::math::store<H>(vh[e]);
      }
    }
  }
  void qkv_rope_backward(const float* dqkv, const float* cos, const float* sin, H* dq, H* dk, H* dv,
                         const gpt::math::head_layout& hl, int kv_heads) {
    const std::size_t hd = std::size_t(hl.head_dim), half = hd / 2, qd = std::size_t(hl.d_model()),
                      kvd = std::size_t(kv_heads) * hd, group = std::size_t(hl.heads / kv_heads);
    std::vector<float> ksum(hd), vsum(hd);
    for (std::size_t r = 0; r < std::size_t(hl.batch) * std::size_t(hl.seq); ++r) {
      const float* c = cos + (r % std::size_t(hl.seq)) * half;
      const float* s = sin + (r % std::size_t(hl.seq)) * half;
      const float* row = dqkv + r * 3 * qd;
      for (std::size_t h = 0; h < std::size_t(hl.heads); ++h)
        for (std::size_t e = 0; e < half; ++e) {
          float x1, x2;
          math::rope_unrotate(row[h * hd + e], row[h * hd + e + half], c[e], s[e], x1, x2);
          dq[r * qd + h * hd + e] = gpt::math::store<H>(x1);
          dq[r * qd + h * hd + e + half] = gpt::math::store<H>(x2);
        }
      for (std::size_t g = 0; g < std::size_t(kv_heads); ++g) {
        std::fill(ksum.begin(), ksum.end(), 0.0f);
        std::fill(vsum.begin(), vsum.end(), 0.0f);
        for (std::size_t h = g * group; h < (g + 1) * group; ++h)
          for (std::size_t e = 0; e < hd; ++e) {
            ksum[e] += row[qd + h * hd + e];
            vsum[e] += row[2 * qd + h * hd + e];
          }
        for (std::size_t e = 0; e < half; ++e) {
          float x1, x2;
          math::rope_unrotate(ksum[e], ksum[e + half], c[e], s[e], x1, x2);
          dk[r * kvd + g * hd + e] = gpt::math::store<H>(x1);
          dk[r * kvd + g * hd + e + half] = gpt::math::store<H>(x2);
        }
        for (std::size_t e = 0; e < hd; ++e) dv[r * kvd + g * hd + e] = gpt::math::store<H>(vsum[e]);
      }
    }
  }

  void swiglu_forward(const float* gate, const float* up, H* act, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) act[i] = gpt::math::store<H>(math::swiglu_forward(gate[i], up[i]));
  }
  void swiglu_backward(const float* gate, const float* up, const float* dact, H* dgate, H* dup, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      float dg, du;
      math::swiglu_backward(gate[i], up[i], dact[i], dg, du);
      dgate[i] = gpt::math::store<H>(dg);
      dup[i] = gpt::math::store<H>(du);
    }
  }
};

}  // namespace llama

#pragma once
// The GPT's operations (ops_contract.hpp) on the CPU, as plain loops over gpt_math.hpp: the
// same per-element and per-row functions the CUDA kernels run, with the kernels' reduction
// orders where they are fixed (column sums by chunks of rows and lanes, the embedding's
// gradient by chunks of each token's rows), and a GEMM that implements cuBLAS's column-major contract
// literally (double accumulation). Slow and simple: it is the reference the GPU is compared
// with (tests/gpu) and the executor that lets CI run the whole device model (tests/examples).
//
// H = float: the model in f32, comparable with the Eigen model to rounding; H = zshard::bf16:
// the GPU's mixed precision, rounding where the GPU rounds.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "attention_math.hpp"
#include "gpt_math.hpp"
#include "ops_contract.hpp"

namespace gpt {

template <class H>
class host_ops {
 public:
  using half_t = H;
  float* col_scratch = nullptr;  // column sums' chunk partials (set by the model)
  int attention_tile = math::attention_tile;  // keys per tile (the GPU's; tests vary it)

  void* allocate(std::size_t bytes) {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p) noexcept { std::free(p); }
  void zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }

  // Column-major C_i = op(A_i) op(B_i) + beta C_i, alpha = 1 (cublasGemmStridedBatchedEx).
  void gemm(bool ta, bool tb, int m, int n, int k, const H* A, int lda, long long sa, const H* B, int ldb,
            long long sb, float* C, int ldc, long long sc, int batch, float beta) {
    for (int i = 0; i < batch; ++i) {
      const H* a = A + i * sa;
      const H* b = B + i * sb;
      float* c = C + i * sc;
      for (int col = 0; col < n; ++col)
        for (int row = 0; row < m; ++row) {
          double acc = 0;
          for (int l = 0; l < k; ++l) {
            const float av = math::load(ta ? a[l + std::size_t(row) * lda] : a[row + std::size_t(l) * lda]);
            const float bv = math::load(tb ? b[col + std::size_t(l) * ldb] : b[l + std::size_t(col) * ldb]);
            acc += double(av) * double(bv);
          }
          float& out = c[row + std::size_t(col) * ldc];
          out = beta == 0.0f ? float(acc) : float(acc) + beta * out;
        }
    }
  }

  void embed_forward(const std::int32_t* tokens, const H* wte, const H* wpe, float* x, int batch, int seq, int d) {
    for (std::size_t r = 0; r < std::size_t(batch) * seq; ++r)
      for (int j = 0; j < d; ++j)
        x[r * d + j] = math::load(wte[std::size_t(tokens[r]) * d + j]) + math::load(wpe[(r % seq) * d + j]);
  }
  // dwte[tok] += its rows by chunks (ops::token_chunks): a token's only chunk row by row from
  // dwte's value; several chunks each summed from 0 into `partial`, then added in order.
  // dwpe[t] += dx[b T + t] in b order.
  void embed_backward(const ops::token_chunks& tc, const float* dx, float* dwte, float* dwpe, int batch, int seq, int d) {
    for (int c = 0; c < tc.chunks; ++c)
      for (int j = 0; j < d; ++j) {
        float* out = tc.chunk_slot[c] < 0 ? dwte + std::size_t(tc.chunk_token[c]) * d + j
                                          : tc.partial + std::size_t(tc.chunk_slot[c]) * d + j;
        float acc = tc.chunk_slot[c] < 0 ? *out : 0.0f;
        for (int i = tc.chunk_begin[c]; i < tc.chunk_begin[c + 1]; ++i) acc += dx[std::size_t(tc.by_row[i]) * d + j];
        *out = acc;
      }
    for (int u = 0; u < tc.multi; ++u)
      for (int j = 0; j < d; ++j) {
        float acc = dwte[std::size_t(tc.multi_token[u]) * d + j];
        for (int sl = tc.multi_slot[u]; sl < tc.multi_slot[u + 1]; ++sl) acc += tc.partial[std::size_t(sl) * d + j];
        dwte[std::size_t(tc.multi_token[u]) * d + j] = acc;
      }
    for (int t = 0; t < seq; ++t)
      for (int j = 0; j < d; ++j) {
        float acc = dwpe[std::size_t(t) * d + j];
        for (int b = 0; b < batch; ++b) acc += dx[(std::size_t(b) * seq + t) * d + j];
        dwpe[std::size_t(t) * d + j] = acc;
      }
  }

  void layer_norm_forward(const float* x, const H* gain, const H* bias, H* y, float* mean, float* rstd, int rows,
                          int d) {
    for (int r = 0; r < rows; ++r) layer_norm_row(x + std::size_t(r) * d, gain, bias, y + std::size_t(r) * d, mean[r], rstd[r], d);
  }
  void residual_layer_norm_forward(const float* x, const float* branch, const H* branch_bias, float* sum, const H* gain,
                                   const H* bias, H* y, float* mean, float* rstd, int rows, int d) {
    residual_add(x, branch, branch_bias, sum, rows, d);
    layer_norm_forward(sum, gain, bias, y, mean, rstd, rows, d);
  }
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const H* gain,
                           float* dx, int rows, int d) {
    for (int r = 0; r < rows; ++r) {
      const float* dyr = dy + std::size_t(r) * d;
      const float* xr = x + std::size_t(r) * d;
      float s1 = 0, s2 = 0;
      for (int j = 0; j < d; ++j) {
        const float dxhat = dyr[j] * math::load(gain[j]);
        s1 += dxhat;
        s2 += dxhat * math::layer_norm_xhat(xr[j], mean[r], rstd[r]);
      }
      const float m1 = s1 / float(d), m2 = s2 / float(d);
      for (int j = 0; j < d; ++j)
        dx[std::size_t(r) * d + j] += math::layer_norm_dx(dyr[j] * math::load(gain[j]),
                                                          math::layer_norm_xhat(xr[j], mean[r], rstd[r]), rstd[r], m1, m2);
    }
  }
  void layer_norm_param_grad(const float* dy, const float* x, const float* mean, const float* rstd, float* dgain,
                             float* dbias, int rows, int d) {
    column_sums(rows, d, dgain, dbias, [&](int r, int j, float& g, float& b) {
      const float v = dy[std::size_t(r) * d + j];
      g += v * math::layer_norm_xhat(x[std::size_t(r) * d + j], mean[r], rstd[r]);
      b += v;
    });
  }
  void bias_grad(const float* dy, float* dbias, int rows, int cols) {
    column_sums(rows, cols, dbias, nullptr, [&](int r, int j, float& s, float&) { s += dy[std::size_t(r) * cols + j]; });
  }

  void bias_gelu_forward(float* pre, const H* bias, H* act, int rows, int cols) {
    for (std::size_t i = 0; i < std::size_t(rows) * cols; ++i) {
      pre[i] += math::load(bias[i % cols]);
      act[i] = math::store<H>(math::gelu_forward(pre[i]));
    }
  }
  void gelu_forward(const float* pre, H* act, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) act[i] = math::store<H>(math::gelu_forward(pre[i]));
  }
  void gelu_backward(const float* pre, float* d, H* d_half, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      d[i] = math::gelu_backward(pre[i], d[i]);
      d_half[i] = math::store<H>(d[i]);
    }
  }

  // qkv [N, 3d] f32 + bias -> half (the attention's input: q | k | v, head h at columns h hd).
  void bias_to_half(const float* x, const H* bias, H* y, int rows, int cols) {
    for (std::size_t r = 0; r < std::size_t(rows); ++r)
      for (int c = 0; c < cols; ++c) y[r * cols + c] = math::store<H>(x[r * cols + c] + math::load(bias[c]));
  }
  // Causal attention by key tiles of attention_tile (attention_math.hpp): out [N, d] half, the
  // row's log-sum-exp in lse [B, H, T]. Dot products in double, rounded to f32 (the GPU's
  // tensor cores accumulate in f32).
  void attention_forward(const H* qkv, H* out, float* lse, const math::head_layout& hl, float scale) {
    const int T = hl.seq, hd = hl.head_dim, tile = attention_tile;
    const std::size_t d = std::size_t(hl.d_model());
    std::vector<float> s(static_cast<std::size_t>(tile)), p(s.size()), acc(static_cast<std::size_t>(hd));
    for (int b = 0; b < hl.batch; ++b)
      for (int h = 0; h < hl.heads; ++h)
        for (int i = 0; i < T; ++i) {
          const H* q = qkv + (std::size_t(b) * T + i) * 3 * d + std::size_t(h) * hd;
          math::online_softmax row;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int k0 = 0; k0 <= i; k0 += tile) {
            const int n = std::min(tile, T - k0);
            float tile_max = -INFINITY;
            for (int j = 0; j < n; ++j)
              if (math::attention_sees(i, k0 + j, T)) {
                s[std::size_t(j)] = dot(q, head_row(qkv, hl, b, h, k0 + j, 1), hd);
                tile_max = std::max(tile_max, s[std::size_t(j)] * scale);
              }
            const float alpha = math::online_softmax_rescale(row, tile_max);
            float tile_sum = 0.0f;
            for (int j = 0; j < n; ++j) {
              p[std::size_t(j)] = math::attention_sees(i, k0 + j, T) ? math::attention_weight(s[std::size_t(j)], row.max, scale) : 0.0f;
              tile_sum += p[std::size_t(j)];
            }
            row.sum += tile_sum;
            for (int e = 0; e < hd; ++e) {
              double pv = 0;
              for (int j = 0; j < n; ++j)
                pv += double(math::load(math::store<H>(p[std::size_t(j)]))) * double(math::load(head_row(qkv, hl, b, h, k0 + j, 2)[e]));
              acc[std::size_t(e)] = math::attention_accumulate(acc[std::size_t(e)], alpha, float(pv));
            }
          }
          H* o = out + (std::size_t(b) * T + i) * d + std::size_t(h) * hd;
          for (int e = 0; e < hd; ++e) o[e] = math::store<H>(math::attention_output(acc[std::size_t(e)], row.sum));
          lse[(std::size_t(b) * hl.heads + h) * T + i] = math::online_softmax_lse(row);
        }
  }
  // d_out [N, d] f32 -> d_out_half; delta [B, H, T] = <half(d_out), out> over each head's row.
  void attention_backward_prepare(const float* d_out, const H* out, H* d_out_half, float* delta,
                                  const math::head_layout& hl) {
    const int T = hl.seq, hd = hl.head_dim;
    const std::size_t d = std::size_t(hl.d_model());
    for (std::size_t i = 0; i < std::size_t(hl.batch) * T * d; ++i) d_out_half[i] = math::store<H>(d_out[i]);
    for (int b = 0; b < hl.batch; ++b)
      for (int h = 0; h < hl.heads; ++h)
        for (int t = 0; t < T; ++t) {
          const std::size_t at = (std::size_t(b) * T + t) * d + std::size_t(h) * hd;
          float dot_row = 0.0f;
          for (int e = 0; e < hd; ++e) dot_row += math::load(d_out_half[at + e]) * math::load(out[at + e]);
          delta[(std::size_t(b) * hl.heads + h) * T + t] = dot_row;
        }
  }
  // The gradients of q, k, v from the probabilities recomputed with the forward's lse: into
  // dqkv [N, 3d] f32 and its half copy (assigned). Sums in double, as the products' f32 on the GPU.
  void attention_backward(const H* qkv, const H* d_out_half, const float* lse, const float* delta, float* dqkv,
                          H* dqkv_half, const math::head_layout& hl, float scale) {
    const int T = hl.seq, hd = hl.head_dim;
    const std::size_t d = std::size_t(hl.d_model());
    std::vector<double> g(std::size_t(3) * T * hd);  // dq | dk | dv of one head, [T, hd] each
    for (int b = 0; b < hl.batch; ++b)
      for (int h = 0; h < hl.heads; ++h) {
        std::fill(g.begin(), g.end(), 0.0);
        double *dq = g.data(), *dk = dq + std::size_t(T) * hd, *dv = dk + std::size_t(T) * hd;
        for (int i = 0; i < T; ++i) {
          const H* q = head_row(qkv, hl, b, h, i, 0);
          const H* dout = d_out_half + (std::size_t(b) * T + i) * d + std::size_t(h) * hd;
          const std::size_t row = (std::size_t(b) * hl.heads + h) * T + i;
          for (int j = 0; j <= i; ++j) {
            const H* k = head_row(qkv, hl, b, h, j, 1);
            const H* v = head_row(qkv, hl, b, h, j, 2);
            const float p = math::attention_prob(dot(q, k, hd), lse[row], scale);
            const float ds = math::softmax_grad(p, dot(dout, v, hd), delta[row], scale);
            const double ph = math::load(math::store<H>(p)), dsh = math::load(math::store<H>(ds));
            for (int e = 0; e < hd; ++e) {
              dv[std::size_t(j) * hd + e] += ph * math::load(dout[e]);
              dk[std::size_t(j) * hd + e] += dsh * math::load(q[e]);
              dq[std::size_t(i) * hd + e] += dsh * math::load(k[e]);
            }
          }
        }
        for (int t = 0; t < T; ++t)
          for (int w = 0; w < 3; ++w)
            for (int e = 0; e < hd; ++e) {
              const std::size_t at = (std::size_t(b) * T + t) * 3 * d + std::size_t(w) * d + std::size_t(h) * hd + e;
              dqkv[at] = float(g[(std::size_t(w) * T + t) * hd + e]);
              dqkv_half[at] = math::store<H>(dqkv[at]);
            }
      }
  }
  void residual_add(const float* x, const float* branch, const H* bias, float* out, int rows, int cols) {
    for (std::size_t i = 0; i < std::size_t(rows) * cols; ++i) out[i] = (branch[i] + math::load(bias[i % cols])) + x[i];
  }
  void to_half(const float* src, H* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = math::store<H>(src[i]);
  }
  // One pass for the row's statistics (online_softmax_push), one for the gradient.
  void cross_entropy(const float* logits, const std::int32_t* targets, float* row_loss, H* dlogits, float grad_weight,
                     int rows, int vocab) {
    for (int r = 0; r < rows; ++r) {
      const float* l = logits + std::size_t(r) * vocab;
      math::online_softmax st;
      for (int j = 0; j < vocab; ++j) math::online_softmax_push(st, l[j]);
      row_loss[r] = math::cross_entropy_loss(st.sum, st.max, l[targets[r]]);
      if (dlogits)
        for (int j = 0; j < vocab; ++j)
          dlogits[std::size_t(r) * vocab + j] =
              math::store<H>(math::cross_entropy_grad(l[j], st.max, st.sum, grad_weight, j == targets[r]));
    }
  }

 private:
  // f(r, j, acc0, acc1) over rows by chunks, then out0[j] += total0 (and out1 when given), in
  // the CUDA kernels' order: within a chunk, lane y (< column_sum_lanes) sums rows begin + y,
  // begin + y + lanes, ... from 0 and the lanes are added in order; the chunks likewise.
  template <class F>
  void column_sums(int rows, int cols, float* out0, float* out1, F&& f) {
    constexpr int lanes = ops::column_sum_lanes;
    const int chunks = int(ops::column_sum_chunks(rows));
    float* part = col_scratch;  // [2, chunks, cols]
    for (int ch = 0; ch < chunks; ++ch)
      for (int j = 0; j < cols; ++j) {
        const int begin = ch * ops::column_sum_rows_per_chunk, end = std::min(rows, begin + ops::column_sum_rows_per_chunk);
        float a = 0, b = 0;
        for (int y = 0; y < lanes; ++y) {
          float la = 0, lb = 0;
          for (int r = begin + y; r < end; r += lanes) f(r, j, la, lb);
          a += la;
          b += lb;
        }
        part[std::size_t(ch) * cols + j] = a;
        part[std::size_t(chunks + ch) * cols + j] = b;
      }
    for (int j = 0; j < cols; ++j) {
      float a = 0, b = 0;
      for (int y = 0; y < lanes; ++y) {
        float la = 0, lb = 0;
        for (int ch = y; ch < chunks; ch += lanes) {
          la += part[std::size_t(ch) * cols + j];
          lb += part[std::size_t(chunks + ch) * cols + j];
        }
        a += la;
        b += lb;
      }
      out0[j] += a;
      if (out1) out1[j] += b;
    }
  }
  // Row t of head h's q (which 0), k (1) or v (2) in qkv [N, 3d].
  static const H* head_row(const H* qkv, const math::head_layout& hl, int b, int h, int t, int which) {
    const std::size_t d = std::size_t(hl.d_model());
    return qkv + (std::size_t(b) * hl.seq + t) * 3 * d + std::size_t(which) * d + std::size_t(h) * hl.head_dim;
  }
  static float dot(const H* a, const H* b, int n) {
    double acc = 0;
    for (int e = 0; e < n; ++e) acc += double(math::load(a[e])) * double(math::load(b[e]));
    return float(acc);
  }
  void layer_norm_row(const float* x, const H* gain, const H* bias, H* y, float& mean, float& rstd, int d) {
    float sum = 0;
    for (int j = 0; j < d; ++j) sum += x[j];
    mean = sum / float(d);
    float ssd = 0;
    for (int j = 0; j < d; ++j) ssd += (x[j] - mean) * (x[j] - mean);
    rstd = math::layer_norm_rstd(ssd, d);
    for (int j = 0; j < d; ++j)
      y[j] = math::store<H>(math::layer_norm_out(math::layer_norm_xhat(x[j], mean, rstd), math::load(gain[j]), math::load(bias[j])));
  }
};

}  // namespace gpt

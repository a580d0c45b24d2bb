#pragma once
// The GPT's operations (ops_contract.hpp) on the CPU, as plain loops over gpt_math.hpp: the
// same per-element and per-row functions the CUDA kernels run, with the kernels' reduction
// orders where they are fixed (column sums by chunks of rows, the embedding's gradient by
// distinct token in row order), and a GEMM that implements cuBLAS's column-major contract
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

#include "gpt_math.hpp"
#include "ops_contract.hpp"

namespace gpt {

template <class H>
class host_ops {
 public:
  using half_t = H;
  float* col_scratch = nullptr;  // column sums' chunk partials (set by the model)

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
  // dwte[tok] += dx[r] for each row of tok in row order; dwpe[t] += dx[b T + t] in b order.
  void embed_backward(const std::int32_t* by_row, const std::int32_t* uniq, const std::int32_t* offsets, int n_uniq,
                      const float* dx, float* dwte, float* dwpe, int batch, int seq, int d) {
    for (int u = 0; u < n_uniq; ++u)
      for (int j = 0; j < d; ++j) {
        float acc = dwte[std::size_t(uniq[u]) * d + j];
        for (int i = offsets[u]; i < offsets[u + 1]; ++i) acc += dx[std::size_t(by_row[i]) * d + j];
        dwte[std::size_t(uniq[u]) * d + j] = acc;
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

  void qkv_bias_permute(const float* qkv, const H* bias, H* q, H* k, H* v, const math::head_layout& hl) {
    const int d = hl.d_model();
    for (int b = 0; b < hl.batch; ++b)
      for (int t = 0; t < hl.seq; ++t)
        for (int c = 0; c < 3 * d; ++c) {
          const std::size_t r = std::size_t(b) * hl.seq + t;
          const float val = qkv[r * 3 * d + c] + math::load(bias[c]);
          const int which = c / d, h = (c % d) / hl.head_dim, e = c % hl.head_dim;
          H* dst = which == 0 ? q : which == 1 ? k : v;
          dst[hl.head_index(b, h, t, e)] = math::store<H>(val);
        }
  }
  void causal_softmax_forward(const float* s, H* p, int rows, int seq, float scale) {
    for (int r = 0; r < rows; ++r) {
      const float* sr = s + std::size_t(r) * seq;
      H* pr = p + std::size_t(r) * seq;
      const int i = r % seq;
      float m = sr[0];
      for (int j = 1; j <= i; ++j) m = std::max(m, sr[j]);
      float sum = 0;
      for (int j = 0; j <= i; ++j) sum += math::softmax_numerator(sr[j], m, scale);
      for (int j = 0; j < seq; ++j) pr[j] = math::store<H>(j <= i ? math::softmax_numerator(sr[j], m, scale) / sum : 0.0f);
    }
  }
  void causal_softmax_backward(const H* p, const float* dp, H* ds, int rows, int seq, float scale) {
    for (int r = 0; r < rows; ++r) {
      const H* pr = p + std::size_t(r) * seq;
      const float* dpr = dp + std::size_t(r) * seq;
      const int i = r % seq;
      float dot = 0;
      for (int j = 0; j <= i; ++j) dot += math::load(pr[j]) * dpr[j];
      for (int j = 0; j < seq; ++j)
        ds[std::size_t(r) * seq + j] = math::store<H>(j <= i ? math::softmax_grad(math::load(pr[j]), dpr[j], dot, scale) : 0.0f);
    }
  }
  void heads_to_rows(const float* o, H* out, const math::head_layout& hl) {
    for_heads(hl, [&](std::size_t row_index, std::size_t head_index) { out[row_index] = math::store<H>(o[head_index]); });
  }
  void rows_to_heads(const float* d_out, H* d_o, const math::head_layout& hl) {
    for_heads(hl, [&](std::size_t row_index, std::size_t head_index) { d_o[head_index] = math::store<H>(d_out[row_index]); });
  }
  void qkv_grad_to_rows(const float* dq, const float* dk, const float* dv, float* dqkv, H* dqkv_half,
                        const math::head_layout& hl) {
    const std::size_t d = std::size_t(hl.d_model());
    for_heads(hl, [&](std::size_t row_index, std::size_t head_index) {
      const std::size_t r = row_index / d, c = row_index % d;
      const float* src[3] = {dq, dk, dv};
      for (std::size_t w = 0; w < 3; ++w) {
        const std::size_t at = r * 3 * d + w * d + c;
        dqkv[at] = src[w][head_index];
        dqkv_half[at] = math::store<H>(dqkv[at]);
      }
    });
  }
  void residual_add(const float* x, const float* branch, const H* bias, float* out, int rows, int cols) {
    for (std::size_t i = 0; i < std::size_t(rows) * cols; ++i) out[i] = (branch[i] + math::load(bias[i % cols])) + x[i];
  }
  void to_half(const float* src, H* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = math::store<H>(src[i]);
  }
  void cross_entropy(const float* logits, const std::int32_t* targets, float* row_loss, H* dlogits, float grad_weight,
                     int rows, int vocab) {
    for (int r = 0; r < rows; ++r) {
      const float* l = logits + std::size_t(r) * vocab;
      float m = l[0];
      for (int j = 1; j < vocab; ++j) m = std::max(m, l[j]);
      float sum = 0;
      for (int j = 0; j < vocab; ++j) sum += expf(l[j] - m);
      row_loss[r] = math::cross_entropy_loss(sum, m, l[targets[r]]);
      if (dlogits)
        for (int j = 0; j < vocab; ++j)
          dlogits[std::size_t(r) * vocab + j] =
              math::store<H>(math::cross_entropy_grad(l[j], m, sum, grad_weight, j == targets[r]));
    }
  }

 private:
  // f(r, j, acc0, acc1) over rows by chunks (each chunk's rows in order, then the chunks in
  // order), then out0[j] += total0 (and out1 when given): the CUDA kernels' order.
  template <class F>
  void column_sums(int rows, int cols, float* out0, float* out1, F&& f) {
    const std::size_t chunks = ops::column_sum_chunks(rows);
    std::vector<float> part(2 * chunks * std::size_t(cols), 0.0f);
    for (std::size_t ch = 0; ch < chunks; ++ch)
      for (int j = 0; j < cols; ++j) {
        float a = 0, b = 0;
        const int end = std::min(rows, int((ch + 1) * ops::column_sum_rows_per_chunk));
        for (int r = int(ch * ops::column_sum_rows_per_chunk); r < end; ++r) f(r, j, a, b);
        part[ch * cols + j] = a;
        part[(chunks + ch) * cols + j] = b;
      }
    for (int j = 0; j < cols; ++j) {
      float a = 0, b = 0;
      for (std::size_t ch = 0; ch < chunks; ++ch) {
        a += part[ch * cols + j];
        b += part[(chunks + ch) * cols + j];
      }
      out0[j] += a;
      if (out1) out1[j] += b;
    }
  }
  template <class F>
  void for_heads(const math::head_layout& hl, F&& f) {
    const std::size_t d = std::size_t(hl.d_model());
    for (int b = 0; b < hl.batch; ++b)
      for (int h = 0; h < hl.heads; ++h)
        for (int t = 0; t < hl.seq; ++t)
          for (int e = 0; e < hl.head_dim; ++e)
            f((std::size_t(b) * hl.seq + t) * d + std::size_t(h) * hl.head_dim + e, hl.head_index(b, h, t, e));
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

#pragma once
// The operations the backend-generic GPT (ops_model.hpp) is written in, and the one matmul
// helper it uses. Two implementations: host_ops.hpp (plain loops on the CPU; CI runs the whole
// model through it) and cuda/cuda_ops.hpp (the project's kernels and cuBLAS on a GPU). Every
// pointer is in the implementation's memory (host or device); `half_t` is the storage type of
// matmul operands (bf16 on the GPU; float or bf16 on the host), everything else is f32.
//
// A conforming Ops provides (n, rows, cols, ... are element counts; "+=" accumulates):
//   using half_t;
//   void* allocate(std::size_t bytes); void deallocate(void*) noexcept;
//   void zero(void* p, std::size_t bytes);
//   void upload(void* dst, const void* host_src, std::size_t bytes);     // ordered before later ops
//   void download(void* host_dst, const void* src, std::size_t bytes);   // complete on return
//   gemm(transa, transb, m, n, k, A, lda, strideA, B, ldb, strideB, C, ldc, strideC, batch, beta):
//     cuBLAS's column-major contract with alpha = 1: C_i = op(A_i) op(B_i) + beta C_i for each
//     of `batch` matrices i (A_i = A + i strideA, ...); A, B half_t, C float, f32 accumulation.
//   embed_forward(tokens, wte, wpe, x, batch, seq, d)                      x = wte[tok] + wpe[t]
//   embed_backward(chunks, dx, dwte, dwpe, batch, seq, d)                  dwte[tok] += its rows by chunks
//                                                                          (token_chunks), dwpe[t] += dx rows of t
//   layer_norm_forward(x, gain, bias, y, mean, rstd, rows, d)              y half_t
//   residual_layer_norm_forward(x, branch, branch_bias, sum, gain, bias, y, mean, rstd, rows, d)
//                                                                          sum = (branch + b) + x, then LN
//   layer_norm_backward(dy, x, mean, rstd, gain, dx, rows, d)              dx += LN'(dy)
//   layer_norm_param_grad(dy, x, mean, rstd, dgain, dbias, rows, d)        column sums, +=
//   bias_grad(dy, dbias, rows, cols)                                       dbias += column sums
//   bias_gelu_forward(pre, bias, act, rows, cols)                          pre += bias; act = gelu(pre)
//   gelu_forward(pre, act, n)                                              act = gelu(pre)
//   gelu_backward(pre, d, d_half, n)                                       d = d gelu'(pre); d_half = d
//   bias_to_half(x, bias, y, rows, cols)                                   y = half(x + b)
//   attention_forward(qkv, out, lse, layout, scale)                        causal, fused (attention_math.hpp):
//                                        qkv [N, 3d] half_t -> out [N, d] half_t, lse [B, H, T] f32
//   attention_backward_prepare(d_out, out, d_out_half, delta, layout)      d_out [N, d] f32 -> half_t;
//                                        delta [B, H, T] = <d_out_half, out> per head row
//   attention_backward(qkv, d_out_half, lse, delta, dqkv, dqkv_half, layout, scale)
//                                        dqkv [N, 3d] f32 and half_t, assigned
//   residual_add(x, branch, bias, out, rows, cols)                         out = (branch + b) + x
//   to_half(src, dst, n)
//   cross_entropy(logits, targets, row_loss, dlogits, grad_weight, rows, vocab)   dlogits null: loss only
// The column sums in layer_norm_param_grad and bias_grad take a scratch of
// column_sum_scratch_floats(rows, cols) floats from `col_scratch` (set by the model).
#include <cstddef>
#include <cstdint>

namespace gpt::ops {

// Row-major C[M, N] (row stride N) = op(A) op(B) + beta C, with op(A) [M, K] and op(B) [K, N]:
// A is stored [M, K] (ta false) or [K, M] (ta true), B [K, N] or [N, K], each row-major. On
// cuBLAS's column-major contract a row-major matrix is its transpose, so C^T = op(B)^T op(A)^T:
// the operands swap, and each keeps its own transpose flag and row length as leading dimension.
struct batch_strides {
  long long a = 0, b = 0, c = 0;
  int count = 1;
};

template <class Ops, class H>
void matmul(Ops& o, int M, int N, int K, const H* A, bool ta, const H* B, bool tb, float* C, float beta,
            batch_strides s = {}) {
  const int lda = ta ? M : K, ldb = tb ? K : N;
  o.gemm(tb, ta, N, M, K, B, ldb, s.b, A, lda, s.a, C, N, s.c, s.count, beta);
}

// The column-sum kernels reduce `rows` in chunks of this many rows, then the chunks in order
// (deterministic, and enough blocks to fill a GPU when there are few columns). Within a chunk
// (and over the chunks) column_sum_lanes partial sums take every column_sum_lanes-th row, and
// are then added in lane order: a GPU block of 32 columns x 8 lanes, 16 rows per thread.
inline constexpr int column_sum_rows_per_chunk = 128;
inline constexpr int column_sum_lanes = 8;
inline std::size_t column_sum_chunks(int rows) {
  return (static_cast<std::size_t>(rows) + column_sum_rows_per_chunk - 1) / column_sum_rows_per_chunk;
}
// Two outputs (layer norm's gain and bias) of `cols` per chunk.
inline std::size_t column_sum_scratch_floats(int rows, int cols) {
  return 2 * column_sum_chunks(rows) * static_cast<std::size_t>(cols);
}

// The token embedding's gradient without atomics (token_chunks.hpp builds it for a batch): the
// rows of each distinct token in row order, cut into chunks of at most embed_rows_per_chunk, so
// no thread walks more than that many rows, nor more than 2 N / embed_rows_per_chunk chunks.
// A token with one chunk adds it into dwte[token] (from dwte's value, row by row); a token
// with several writes each chunk's sum to a row of `partial`, then adds those in order.
inline constexpr int embed_rows_per_chunk = 128;
struct token_chunks {
  const std::int32_t* by_row = nullptr;       // [N] rows sorted by token, row order within a token
  const std::int32_t* chunk_begin = nullptr;  // [chunks + 1] positions in by_row
  const std::int32_t* chunk_token = nullptr;  // [chunks]
  const std::int32_t* chunk_slot = nullptr;   // [chunks] -1: its token's only chunk, else its row of `partial`
  const std::int32_t* multi_token = nullptr;  // [multi] the tokens with several chunks
  const std::int32_t* multi_slot = nullptr;   // [multi + 1] their rows of `partial`, consecutive, in order
  int chunks = 0, multi = 0;
  float* partial = nullptr;  // [token_chunk_slots(N), d]
};
// Rows of `partial` a batch of `rows` tokens can need: a token with c > 1 chunks has more than
// (c - 1) x embed_rows_per_chunk rows, so c <= 2 x its rows / embed_rows_per_chunk.
inline std::size_t token_chunk_slots(std::size_t rows) {
  return 2 * ((rows + embed_rows_per_chunk - 1) / embed_rows_per_chunk);
}

}  // namespace gpt::ops

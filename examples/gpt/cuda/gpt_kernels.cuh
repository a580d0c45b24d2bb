#pragma once
// The GPT's kernels (device code), included by cuda_ops.cu only: each maps threads to
// gpt_math.hpp's element or row functions; the mapping is the only thing here:
//   element-wise        grid-stride loops over the flat index, or a 2-D grid (columns x rows)
//                       where an element needs its column (no division per element)
//   row-wise            one warp per row (layer norm; rows of up to 1024 elements held in
//                       registers) or one block per row (cross-entropy over the vocabulary),
//                       sums by a fixed xor-shuffle tree
//   column sums         one thread per column over a chunk of rows, then the chunks in order
// so every result is deterministic, and the host loops (host_ops.hpp) are the same math. The
// fused attention's kernels are in attention_kernels.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../attention_math.hpp"
#include "../gpt_math.hpp"
#include "../ops_contract.hpp"

namespace gpt::cuda::kernels {

using half_t = zshard::bf16;
namespace m = gpt::math;

constexpr int threads = 256;
constexpr int warps_per_block = threads / 32;
constexpr unsigned full_mask = 0xffffffffu;

inline unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>((n + threads - 1) / threads, 1, 16384));
}
inline unsigned row_blocks(int rows) { return static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block); }
// A 2-D grid for a [rows, cols] map: x over the columns (threads per block), y over the rows,
// each y block walking rows by the grid's height; about 16384 blocks at most, as blocks_for.
inline dim3 grid_2d(int rows, int cols) {
  const unsigned x = static_cast<unsigned>((cols + threads - 1) / threads);
  const unsigned y = static_cast<unsigned>(std::clamp<long long>(16384 / x, 1, std::clamp(rows, 1, 65535)));
  return dim3(x, y);
}

__device__ __forceinline__ std::size_t first() { return std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ std::size_t stride() { return std::size_t(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(full_mask, v, o));
  return v;
}
// Every thread of the block gets the same value; `shared` holds 32 floats.
template <bool is_max>
__device__ float block_reduce(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = is_max ? warp_max(v) : warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : (is_max ? -INFINITY : 0.0f);
  v = is_max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // shared may be reused at once
  return v;
}

// ---- embedding -----------------------------------------------------------------------------------
// x[b T + t] = wte[token] + wpe[t]: a 3-D grid (columns, positions, sequences), no division.
__global__ void __launch_bounds__(threads) embed_forward_kernel(const std::int32_t* tokens, const half_t* wte,
                                                                const half_t* wpe, float* x, int batch, int seq, int d) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  for (int b = blockIdx.z; b < batch; b += gridDim.z)
    for (int t = blockIdx.y; t < seq; t += gridDim.y) {
      const std::size_t r = std::size_t(b) * seq + t;
      x[r * d + j] = m::load(wte[std::size_t(tokens[r]) * d + j]) + m::load(wpe[std::size_t(t) * d + j]);
    }
}
// dwte by chunks of each token's rows (ops::token_chunks): no thread walks more than
// embed_rows_per_chunk rows, then (second kernel) more than token_chunk_slots(N) partials.
__global__ void __launch_bounds__(threads) embed_backward_chunks_kernel(ops::token_chunks tc, const float* dx, float* dwte,
                                                                        int d) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  for (int c = blockIdx.y; c < tc.chunks; c += gridDim.y) {
    const int slot = tc.chunk_slot[c];
    float* out = slot < 0 ? dwte + std::size_t(tc.chunk_token[c]) * d + j : tc.partial + std::size_t(slot) * d + j;
    float acc = slot < 0 ? *out : 0.0f;
    for (int i = tc.chunk_begin[c]; i < tc.chunk_begin[c + 1]; ++i) acc += dx[std::size_t(tc.by_row[i]) * d + j];
    *out = acc;
  }
}
__global__ void __launch_bounds__(threads) embed_backward_multi_kernel(ops::token_chunks tc, float* dwte, int d) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  for (int u = blockIdx.y; u < tc.multi; u += gridDim.y) {
    float* out = dwte + std::size_t(tc.multi_token[u]) * d + j;
    float acc = *out;
    for (int sl = tc.multi_slot[u]; sl < tc.multi_slot[u + 1]; ++sl) acc += tc.partial[std::size_t(sl) * d + j];
    *out = acc;
  }
}
__global__ void __launch_bounds__(threads) embed_backward_positions_kernel(const float* dx, float* dwpe, int batch,
                                                                           int seq, int d) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  for (int t = blockIdx.y; t < seq; t += gridDim.y) {
    float acc = dwpe[std::size_t(t) * d + j];
    for (int b = 0; b < batch; ++b) acc += dx[(std::size_t(b) * seq + t) * d + j];
    dwpe[std::size_t(t) * d + j] = acc;
  }
}

// ---- layer norm: one warp per row ---------------------------------------------------------------
// With `branch`: the row is first (branch + branch_bias) + x, stored to `sum` (the residual).
__global__ void __launch_bounds__(threads) layer_norm_forward_kernel(const float* x, const float* branch, const half_t* branch_bias, float* sum,
                                          const half_t* gain, const half_t* bias, half_t* y, float* mean_out,
                                          float* rstd_out, int rows, int d) {
  const int row = blockIdx.x * warps_per_block + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + std::size_t(row) * d;
  const float* in = xr;
  if (branch) {
    const float* br = branch + std::size_t(row) * d;
    float* sr = sum + std::size_t(row) * d;
    for (int j = lane; j < d; j += 32) sr[j] = (br[j] + m::load(branch_bias[j])) + xr[j];
    in = sr;  // read back by the lane that wrote it
  }
  float s = 0;
  for (int j = lane; j < d; j += 32) s += in[j];
  const float mean = warp_sum(s) / float(d);
  float ssd = 0;
  for (int j = lane; j < d; j += 32) ssd += (in[j] - mean) * (in[j] - mean);
  const float rstd = m::layer_norm_rstd(warp_sum(ssd), d);
  half_t* yr = y + std::size_t(row) * d;
  for (int j = lane; j < d; j += 32)
    yr[j] = m::store<half_t>(m::layer_norm_out(m::layer_norm_xhat(in[j], mean, rstd), m::load(gain[j]), m::load(bias[j])));
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}
__global__ void __launch_bounds__(threads) layer_norm_backward_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                           const half_t* gain, float* dx, int rows, int d) {
  const int row = blockIdx.x * warps_per_block + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* dyr = dy + std::size_t(row) * d;
  const float* xr = x + std::size_t(row) * d;
  const float mu = mean[row], r = rstd[row];
  float s1 = 0, s2 = 0;
  for (int j = lane; j < d; j += 32) {
    const float dxhat = dyr[j] * m::load(gain[j]);
    s1 += dxhat;
    s2 += dxhat * m::layer_norm_xhat(xr[j], mu, r);
  }
  const float m1 = warp_sum(s1) / float(d), m2 = warp_sum(s2) / float(d);
  float* dxr = dx + std::size_t(row) * d;
  for (int j = lane; j < d; j += 32)
    dxr[j] += m::layer_norm_dx(dyr[j] * m::load(gain[j]), m::layer_norm_xhat(xr[j], mu, r), r, m1, m2);
}

// Rows of at most 32 x per_lane elements stay in registers: one read and one write per element
// (the loop kernels above re-read the row per pass). Same sums in the same order: a lane adds
// its elements j = lane, lane + 32, ... and +0.0 past the row's end, which changes no sum.
// Registers cap their occupancy (the backward's row of 24 took 72 per thread: three blocks of
// 256 per SM); the launch bounds ask for one block more. ptxas -v, sm_90: the backward's rows
// of 24 and 32 then take 64 and 80 registers and spill one 4-byte value each, the forward's
// none.
template <int per_lane>
constexpr int regs_min_blocks = per_lane <= 24 ? 4 : 3;
template <int per_lane>
__global__ void __launch_bounds__(threads, regs_min_blocks<per_lane>) layer_norm_forward_regs_kernel(const float* x, const float* branch, const half_t* branch_bias,
                                               float* sum, const half_t* gain, const half_t* bias, half_t* y,
                                               float* mean_out, float* rstd_out, int rows, int d) {
  const int row = blockIdx.x * warps_per_block + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const std::size_t at = std::size_t(row) * d;
  float v[per_lane];
  float s = 0;
#pragma unroll
  for (int k = 0; k < per_lane; ++k) {
    const int j = lane + 32 * k;
    v[k] = 0.0f;
    if (j < d) {
      v[k] = branch ? (branch[at + j] + m::load(branch_bias[j])) + x[at + j] : x[at + j];
      if (branch) sum[at + j] = v[k];
    }
    s += v[k];
  }
  const float mean = warp_sum(s) / float(d);
  float ssd = 0;
#pragma unroll
  for (int k = 0; k < per_lane; ++k)
    if (lane + 32 * k < d) ssd += (v[k] - mean) * (v[k] - mean);
  const float rstd = m::layer_norm_rstd(warp_sum(ssd), d);
#pragma unroll
  for (int k = 0; k < per_lane; ++k) {
    const int j = lane + 32 * k;
    if (j < d)
      y[at + j] = m::store<half_t>(m::layer_norm_out(m::layer_norm_xhat(v[k], mean, rstd), m::load(gain[j]), m::load(bias[j])));
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}
template <int per_lane>
__global__ void __launch_bounds__(threads, regs_min_blocks<per_lane>) layer_norm_backward_regs_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                                const half_t* gain, float* dx, int rows, int d) {
  const int row = blockIdx.x * warps_per_block + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const std::size_t at = std::size_t(row) * d;
  const float mu = mean[row], r = rstd[row];
  float dxhat[per_lane], xhat[per_lane];
  float s1 = 0, s2 = 0;
#pragma unroll
  for (int k = 0; k < per_lane; ++k) {
    const int j = lane + 32 * k;
    dxhat[k] = 0.0f;
    xhat[k] = 0.0f;
    if (j < d) {
      dxhat[k] = dy[at + j] * m::load(gain[j]);
      xhat[k] = m::layer_norm_xhat(x[at + j], mu, r);
    }
    s1 += dxhat[k];
    s2 += dxhat[k] * xhat[k];
  }
  const float m1 = warp_sum(s1) / float(d), m2 = warp_sum(s2) / float(d);
#pragma unroll
  for (int k = 0; k < per_lane; ++k) {
    const int j = lane + 32 * k;
    if (j < d) dx[at + j] += m::layer_norm_dx(dxhat[k], xhat[k], r, m1, m2);
  }
}
// Calls f(std::integral_constant<int, per_lane>) with the smallest register row that holds n
// elements (fewer registers per thread, more warps per SM), or returns false when n > 1024.
template <class F>
bool with_register_row(int n, F&& f) {
  if (n <= 32 * 8) return f(std::integral_constant<int, 8>{}), true;
  if (n <= 32 * 24) return f(std::integral_constant<int, 24>{}), true;  // GPT-2 small's d_model 768
  if (n <= 32 * 32) return f(std::integral_constant<int, 32>{}), true;
  return false;
}

// ---- column sums: chunk partials, then the chunks in order (host_ops::column_sums' order) -------
// A block is 32 columns x column_sum_lanes lanes (256 threads): lane y of a column sums every
// lanes-th row of the chunk from row y (coalesced: a warp reads 32 adjacent columns of a row),
// then lane 0 adds the lanes in order. Layer norm's parameter gradients (two sums) when x is
// given, else one plain column sum of dy.
constexpr int column_lanes = ops::column_sum_lanes;
static_assert(32 * column_lanes == threads, "a column-sum block is 32 columns x column_sum_lanes lanes");
__global__ void __launch_bounds__(threads) column_partial_kernel(const float* dy, const float* x, const float* mean,
                                                                 const float* rstd, float* partial, int rows, int cols,
                                                                 int chunks) {
  __shared__ float lane_a[column_lanes][33], lane_b[column_lanes][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5, j = blockIdx.x * 32 + tx, ch = blockIdx.y;
  const int begin = ch * ops::column_sum_rows_per_chunk, end = min(rows, begin + ops::column_sum_rows_per_chunk);
  float a = 0, b = 0;
  if (j < cols)
    for (int r = begin + ty; r < end; r += column_lanes) {
      const float v = dy[std::size_t(r) * cols + j];
      if (x) {
        a += v * m::layer_norm_xhat(x[std::size_t(r) * cols + j], mean[r], rstd[r]);
        b += v;
      } else {
        a += v;
      }
    }
  lane_a[ty][tx] = a;
  lane_b[ty][tx] = b;
  __syncthreads();
  if (ty != 0 || j >= cols) return;
  float ta = 0, tb = 0;
  for (int y = 0; y < column_lanes; ++y) {
    ta += lane_a[y][tx];
    tb += lane_b[y][tx];
  }
  partial[std::size_t(ch) * cols + j] = ta;
  if (x) partial[std::size_t(chunks + ch) * cols + j] = tb;
}
__global__ void __launch_bounds__(threads) column_finish_kernel(const float* partial, float* out0, float* out1, int cols,
                                                                int chunks) {
  __shared__ float lane_a[column_lanes][33], lane_b[column_lanes][33];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5, j = blockIdx.x * 32 + tx;
  float a = 0, b = 0;
  if (j < cols)
    for (int ch = ty; ch < chunks; ch += column_lanes) {
      a += partial[std::size_t(ch) * cols + j];
      if (out1) b += partial[std::size_t(chunks + ch) * cols + j];
    }
  lane_a[ty][tx] = a;
  lane_b[ty][tx] = b;
  __syncthreads();
  if (ty != 0 || j >= cols) return;
  float ta = 0, tb = 0;
  for (int y = 0; y < column_lanes; ++y) {
    ta += lane_a[y][tx];
    tb += lane_b[y][tx];
  }
  out0[j] += ta;
  if (out1) out1[j] += tb;
}

// ---- GELU -----------------------------------------------------------------------------------------
__global__ void __launch_bounds__(threads) bias_gelu_forward_kernel(float* pre, const half_t* bias, half_t* act, int rows,
                                                                    int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float b = m::load(bias[c]);
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::size_t i = std::size_t(r) * cols + c;
    const float v = pre[i] + b;
    pre[i] = v;
    act[i] = m::store<half_t>(m::gelu_forward(v));
  }
}
__global__ void __launch_bounds__(threads) gelu_forward_kernel(const float* pre, half_t* act, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride()) act[i] = m::store<half_t>(m::gelu_forward(pre[i]));
}
__global__ void __launch_bounds__(threads) gelu_backward_kernel(const float* pre, float* d, half_t* d_half, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride()) {
    const float g = m::gelu_backward(pre[i], d[i]);
    d[i] = g;
    d_half[i] = m::store<half_t>(g);
  }
}

// ---- bias + cast: [rows, cols] f32 + bias -> half (the attention's qkv input) ------------------------
// A 2-D grid (columns by blocks of threads, rows by blocks): no index division per element.
__global__ void __launch_bounds__(threads) bias_to_half_kernel(const float* x, const half_t* bias, half_t* y, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float b = m::load(bias[c]);
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::size_t i = std::size_t(r) * cols + c;
    y[i] = m::store<half_t>(x[i] + b);
  }
}

// ---- residual, casts, loss ----------------------------------------------------------------------------
__global__ void __launch_bounds__(threads) residual_add_kernel(const float* x, const float* branch, const half_t* bias,
                                                               float* out, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float b = m::load(bias[c]);
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::size_t i = std::size_t(r) * cols + c;
    out[i] = (branch[i] + b) + x[i];
  }
}
__global__ void __launch_bounds__(threads) to_half_kernel(const float* src, half_t* dst, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride()) dst[i] = m::store<half_t>(src[i]);
}
// One block per row of logits: one pass for the row's softmax statistics (each thread its own
// online_softmax over every blockDim-th logit, four per 16-byte load where the row allows,
// then a fixed xor-shuffle tree of online_softmax_merge), one for the gradient; the loss
// alone reads the row once.
constexpr int ce_threads = 512;
__device__ __forceinline__ m::online_softmax merge_across(m::online_softmax st, int offset) {
  const m::online_softmax other{__shfl_xor_sync(full_mask, st.max, offset), __shfl_xor_sync(full_mask, st.sum, offset)};
  return m::online_softmax_merge(st, other);
}
__global__ void __launch_bounds__(ce_threads) cross_entropy_kernel(const float* logits, const std::int32_t* targets,
                                                                   float* row_loss, half_t* dlogits, float w, int vocab) {
  __shared__ float part_max[32], part_sum[32];
  const std::size_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  const bool vec = vocab % 4 == 0;  // rows then start 16-byte aligned (the logits buffer is)
  m::online_softmax st;
  if (vec) {
    for (int j = 4 * threadIdx.x; j < vocab; j += 4 * ce_threads) {
      const float4 v = *reinterpret_cast<const float4*>(l + j);
      m::online_softmax_push(st, v.x), m::online_softmax_push(st, v.y);
      m::online_softmax_push(st, v.z), m::online_softmax_push(st, v.w);
    }
  } else {
    for (int j = threadIdx.x; j < vocab; j += ce_threads) m::online_softmax_push(st, l[j]);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) st = merge_across(st, o);
  if (lane == 0) part_max[warp] = st.max, part_sum[warp] = st.sum;
  __syncthreads();
  st = lane < ce_threads / 32 ? m::online_softmax{part_max[lane], part_sum[lane]} : m::online_softmax{};
  for (int o = 16; o > 0; o >>= 1) st = merge_across(st, o);  // every warp the same: the block's total
  const int target = targets[row];
  if (threadIdx.x == 0) row_loss[row] = m::cross_entropy_loss(st.sum, st.max, l[target]);
  if (!dlogits) return;
  half_t* g = dlogits + row * vocab;
  for (int j = threadIdx.x; j < vocab; j += ce_threads)
    g[j] = m::store<half_t>(m::cross_entropy_grad(l[j], st.max, st.sum, w, j == target));
}

__global__ void __launch_bounds__(threads) fill_pattern_kernel(half_t* x, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride())
    x[i] = m::store<half_t>(float(int((i * 2654435761u) % 2001u) - 1000) * 1e-3f);
}

}  // namespace gpt::cuda::kernels

#pragma once
// The fused causal attention's kernels (device code; included by cuda_ops.cu only): thin
// launches of attention_math.hpp's row functions around bf16 tensor-core products (wmma,
// 16 x 16 x 16, f32 accumulation). A block holds a tile of attention_tile (64) queries or keys
// in shared memory; each of its four warps owns 16 rows of the tile, and within a warp, lane
// (r, half) = (lane & 15, lane >> 4) owns row r and the columns of its half (j = 2 c + half)
// for the row-wise math. The [T, T] scores exist one [64, 64] tile at a time in shared memory.
//
//   attention_forward_kernel      block = (query tile, b h); walks the key tiles up to the
//                                 diagonal with the online softmax; out [N, d] bf16 and the
//                                 rows' log-sum-exp
//   attention_delta_kernel        block = row; d_out -> bf16, delta = <d_out, out> per head
//   attention_dkdv_kernel         block = (key tile, b h); walks the query tiles from the
//                                 diagonal on: dv += p^T dout, dk += ds^T q
//   attention_dq_kernel           block = (query tile, b h); walks the key tiles: dq += ds k
// dk/dv and dq are two kernels so that each output is summed by one block in a fixed order:
// deterministic, no atomics (it costs recomputing s and dp once more).
#include <cuda_bf16.h>
#include <mma.h>

#include "../attention_math.hpp"
#include "gpt_kernels.cuh"

namespace gpt::cuda::kernels {

namespace wmma = nvcuda::wmma;

constexpr int att_tile = m::attention_tile;
constexpr int att_warps = att_tile / 16;
constexpr int att_threads = 32 * att_warps;
static_assert(att_tile == 64, "a lane holds 32 columns of a tile row: two lanes per row of 64");

using frag_a = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using frag_b_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using frag_b_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using frag_c = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// One block's shared memory: `halves` bf16 tiles [64, hp] (row stride ldh), the f32 scratch
// [64, max(64, hp)] (stride lds: scores, then products), the bf16 [64, 64] p or ds (stride
// ldp), `accs` f32 accumulators [64, hp] (stride lda) and `stats` arrays of 64 floats. Strides
// keep every 16-row fragment 32-byte aligned (wmma), are a multiple of 8 bf16 / 4 f32, and are
// 8 or 4 elements past the row so that the 16 rows a warp's lanes walk fall in different banks.
struct att_smem {
  int hp, ldh, lds, ldp, lda;
  std::size_t half_at[4], s_at, p_at, acc_at[2], stats_at[2], bytes;

  __host__ __device__ att_smem(int head_dim, int halves, int accs, int stats) {
    hp = (head_dim + 15) / 16 * 16;
    ldh = hp + 8;
    lds = (hp > att_tile ? hp : att_tile) + 4;
    ldp = att_tile + 8;
    lda = hp + 4;
    std::size_t at = 0;
    const auto take = [&](std::size_t n) {
      const std::size_t here = at;
      at += (n + 127) / 128 * 128;
      return here;
    };
    for (int i = 0; i < 4; ++i) half_at[i] = i < halves ? take(std::size_t(att_tile) * ldh * 2) : 0;
    s_at = take(std::size_t(att_tile) * lds * 4);
    p_at = take(std::size_t(att_tile) * ldp * 2);
    for (int i = 0; i < 2; ++i) acc_at[i] = i < accs ? take(std::size_t(att_tile) * lda * 4) : 0;
    for (int i = 0; i < 2; ++i) stats_at[i] = i < stats ? take(att_tile * 4) : 0;
    bytes = at;
  }
};
// The three kernels' layouts (the forward: q, k, v and the output accumulator; dk/dv: k, v, q,
// dout, two accumulators, the query tile's lse and delta; dq: q, dout, k, v, one accumulator).
__host__ __device__ inline att_smem att_forward_smem(int head_dim) { return att_smem(head_dim, 3, 1, 0); }
__host__ __device__ inline att_smem att_dkdv_smem(int head_dim) { return att_smem(head_dim, 4, 2, 2); }
__host__ __device__ inline att_smem att_dq_smem(int head_dim) { return att_smem(head_dim, 4, 1, 0); }

template <class T>
__device__ __forceinline__ T* att_at(unsigned char* base, std::size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}
__device__ __forceinline__ const __nv_bfloat16* bf(const half_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

// Rows [0, 64) of a bf16 matrix with row stride ld (src: its row 0 at the head's first column)
// into a [64, hp] tile: zeros past rows_valid and past hd, so padded rows and columns add
// nothing to a product (and carry no NaN from uninitialised memory into one). vec: 16-byte
// loads (hd, ld and src's column multiples of 8, the matrix 16-byte aligned).
__device__ void att_load_tile(const half_t* src, std::size_t ld, int rows_valid, int hd, const att_smem& sm,
                              half_t* dst, bool vec) {
  const int tid = threadIdx.x;
  if (vec) {
    const int per_row = sm.hp / 8, step = att_threads / per_row, c = tid % per_row;
    if (tid >= step * per_row) return;
    for (int r = tid / per_row; r < att_tile; r += step) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows_valid && c * 8 < hd) v = *reinterpret_cast<const uint4*>(src + std::size_t(r) * ld + c * 8);
      *reinterpret_cast<uint4*>(dst + r * sm.ldh + c * 8) = v;
    }
  } else {
    const int step = att_threads / sm.hp, e = tid % sm.hp;
    if (tid >= step * sm.hp) return;
    for (int r = tid / sm.hp; r < att_tile; r += step)
      dst[r * sm.ldh + e] = r < rows_valid && e < hd ? src[std::size_t(r) * ld + e] : half_t{0};
  }
}

// The warp's 16 rows of C[64, 16 n_blocks] (f32, stride ldc) = A[rows of the warp, k16 x 16]
// B, with A row-major (stride lda) and B either row-major [k, n] (stride ldb) or given as its
// transpose, row-major [n, k] (col-major B, stride ldb). acc: C's previous value is added.
template <bool b_transposed>
__device__ void att_warp_product(const half_t* a, int lda, const half_t* b, int ldb, int k16, float* c, int ldc,
                                 int n_blocks, bool acc) {
  const int w = threadIdx.x >> 5;
  using frag_b = std::conditional_t<b_transposed, frag_b_col, frag_b_row>;
  for (int n = 0; n < n_blocks; ++n) {
    frag_c out;
    float* c_at = c + std::size_t(w) * 16 * ldc + n * 16;
    if (acc) wmma::load_matrix_sync(out, c_at, unsigned(ldc), wmma::mem_row_major);
    else wmma::fill_fragment(out, 0.0f);
    for (int kk = 0; kk < k16; ++kk) {
      frag_a fa;
      frag_b fb;
      wmma::load_matrix_sync(fa, bf(a + std::size_t(w) * 16 * lda + kk * 16), unsigned(lda));
      if constexpr (b_transposed) wmma::load_matrix_sync(fb, bf(b + std::size_t(n) * 16 * ldb + kk * 16), unsigned(ldb));
      else wmma::load_matrix_sync(fb, bf(b + std::size_t(kk) * 16 * ldb + n * 16), unsigned(ldb));
      wmma::mma_sync(out, fa, fb, out);
    }
    wmma::store_matrix_sync(c_at, out, unsigned(ldc), wmma::mem_row_major);
  }
  __syncwarp();  // the lanes read what the warp stored
}

struct att_lane {
  int warp, half, row;  // row of the tile this lane works on; its columns are j = 2 c + half
  __device__ att_lane() : warp(threadIdx.x >> 5), half((threadIdx.x & 31) >> 4), row(warp * 16 + (threadIdx.x & 15)) {}
};

__device__ __forceinline__ bool att_vec_ok(const void* p, std::size_t ld, int col, int hd) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0 && ld % 8 == 0 && col % 8 == 0 && hd % 8 == 0;
}

__global__ void __launch_bounds__(att_threads) attention_forward_kernel(const half_t* qkv, half_t* out, float* lse,
                                                                        m::head_layout hl, float scale) {
  extern __shared__ __align__(128) unsigned char att_shared[];
  const att_smem sm = att_forward_smem(hl.head_dim);
  half_t *qs = att_at<half_t>(att_shared, sm.half_at[0]), *ks = att_at<half_t>(att_shared, sm.half_at[1]),
         *vs = att_at<half_t>(att_shared, sm.half_at[2]), *ps = att_at<half_t>(att_shared, sm.p_at);
  float *ss = att_at<float>(att_shared, sm.s_at), *os = att_at<float>(att_shared, sm.acc_at[0]);
  const int bh = blockIdx.y, b = bh / hl.heads, h = bh - b * hl.heads, T = hl.seq, hd = hl.head_dim, d = hl.d_model();
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * att_tile;  // the longest rows first
  const std::size_t ld = std::size_t(3) * d;
  const half_t* seq_q = qkv + std::size_t(b) * T * ld + std::size_t(h) * hd;
  const bool vec = att_vec_ok(qkv, ld, h * hd, hd);
  att_load_tile(seq_q + std::size_t(q0) * ld, ld, min(att_tile, T - q0), hd, sm, qs, vec);
  for (int i = threadIdx.x; i < att_tile * sm.lda; i += att_threads) os[i] = 0.0f;
  const att_lane me;
  const int q = q0 + me.row;
  m::online_softmax st;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * att_tile;
    __syncthreads();  // the last tile's k and v are read
    att_load_tile(seq_q + d + std::size_t(k0) * ld, ld, min(att_tile, T - k0), hd, sm, ks, vec);
    att_load_tile(seq_q + 2 * d + std::size_t(k0) * ld, ld, min(att_tile, T - k0), hd, sm, vs, vec);
    __syncthreads();
    att_warp_product<true>(qs, sm.ldh, ks, sm.ldh, sm.hp / 16, ss, sm.lds, att_tile / 16, false);  // s = q k^T
    float s[att_tile / 2];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < att_tile / 2; ++c) {
      const int j = 2 * c + me.half;
      s[c] = ss[me.row * sm.lds + j];
      if (m::attention_sees(q, k0 + j, T)) tile_max = fmaxf(tile_max, s[c] * scale);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(full_mask, tile_max, 16));
    const float alpha = m::online_softmax_rescale(st, tile_max);
    float tile_sum = 0.0f;
#pragma unroll
    for (int c = 0; c < att_tile / 2; ++c) {
      const int j = 2 * c + me.half;
      const float p = m::attention_sees(q, k0 + j, T) ? m::attention_weight(s[c], st.max, scale) : 0.0f;
      tile_sum += p;
      ps[me.row * sm.ldp + j] = m::store<half_t>(p);
    }
    st.sum += tile_sum + __shfl_xor_sync(full_mask, tile_sum, 16);
    __syncwarp();
    att_warp_product<false>(ps, sm.ldp, vs, sm.ldh, att_tile / 16, ss, sm.lds, sm.hp / 16, false);  // p v
    for (int e = me.half; e < sm.hp; e += 2)
      os[me.row * sm.lda + e] = m::attention_accumulate(os[me.row * sm.lda + e], alpha, ss[me.row * sm.lds + e]);
    __syncwarp();  // ss is overwritten by the next tile's product
  }
  if (q >= T) return;
  half_t* o = out + (std::size_t(b) * T + q) * d + std::size_t(h) * hd;
  for (int e = me.half; e < hd; e += 2) o[e] = m::store<half_t>(m::attention_output(os[me.row * sm.lda + e], st.sum));
  if (me.half == 0) lse[std::size_t(bh) * T + q] = m::online_softmax_lse(st);
}

// One block (256 threads) per row of [N, d]: d_out -> bf16, and per head the row's delta.
__global__ void attention_delta_kernel(const float* d_out, const half_t* out, half_t* d_out_half, float* delta,
                                       m::head_layout hl) {
  const int row = blockIdx.x, b = row / hl.seq, t = row - b * hl.seq, hd = hl.head_dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::size_t at = std::size_t(row) * hl.d_model();
  for (int h = warp; h < hl.heads; h += warps_per_block) {
    float acc = 0.0f;
    for (int e = lane; e < hd; e += 32) {
      const std::size_t i = at + std::size_t(h) * hd + e;
      const half_t g = m::store<half_t>(d_out[i]);
      d_out_half[i] = g;
      acc += m::load(g) * m::load(out[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) delta[(std::size_t(b) * hl.heads + h) * hl.seq + t] = acc;
  }
}

__global__ void __launch_bounds__(att_threads) attention_dkdv_kernel(const half_t* qkv, const half_t* d_out_half,
                                                                     const float* lse, const float* delta, float* dqkv,
                                                                     half_t* dqkv_half, m::head_layout hl, float scale) {
  extern __shared__ __align__(128) unsigned char att_shared[];
  const att_smem sm = att_dkdv_smem(hl.head_dim);
  half_t *ks = att_at<half_t>(att_shared, sm.half_at[0]), *vs = att_at<half_t>(att_shared, sm.half_at[1]),
         *qs = att_at<half_t>(att_shared, sm.half_at[2]), *dos = att_at<half_t>(att_shared, sm.half_at[3]),
         *ps = att_at<half_t>(att_shared, sm.p_at);
  float *ss = att_at<float>(att_shared, sm.s_at), *dk = att_at<float>(att_shared, sm.acc_at[0]),
        *dv = att_at<float>(att_shared, sm.acc_at[1]), *lse_s = att_at<float>(att_shared, sm.stats_at[0]),
        *delta_s = att_at<float>(att_shared, sm.stats_at[1]);
  const int bh = blockIdx.y, b = bh / hl.heads, h = bh - b * hl.heads, T = hl.seq, hd = hl.head_dim, d = hl.d_model();
  const int kt = blockIdx.x, k0 = kt * att_tile, tiles = (T + att_tile - 1) / att_tile;  // the longest walks first
  const std::size_t ld = std::size_t(3) * d;
  const half_t* seq_q = qkv + std::size_t(b) * T * ld + std::size_t(h) * hd;
  const half_t* seq_do = d_out_half + std::size_t(b) * T * d + std::size_t(h) * hd;
  const bool vec = att_vec_ok(qkv, ld, h * hd, hd), vec_do = att_vec_ok(d_out_half, std::size_t(d), h * hd, hd);
  att_load_tile(seq_q + d + std::size_t(k0) * ld, ld, min(att_tile, T - k0), hd, sm, ks, vec);
  att_load_tile(seq_q + 2 * d + std::size_t(k0) * ld, ld, min(att_tile, T - k0), hd, sm, vs, vec);
  for (int i = threadIdx.x; i < att_tile * sm.lda; i += att_threads) dk[i] = dv[i] = 0.0f;
  const att_lane me;
  const int key = k0 + me.row;
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * att_tile;
    __syncthreads();  // the last query tile is read
    att_load_tile(seq_q + std::size_t(q0) * ld, ld, min(att_tile, T - q0), hd, sm, qs, vec);
    att_load_tile(seq_do + std::size_t(q0) * d, std::size_t(d), min(att_tile, T - q0), hd, sm, dos, vec_do);
    if (threadIdx.x < att_tile) {
      const bool in = q0 + int(threadIdx.x) < T;
      lse_s[threadIdx.x] = in ? lse[std::size_t(bh) * T + q0 + threadIdx.x] : 0.0f;
      delta_s[threadIdx.x] = in ? delta[std::size_t(bh) * T + q0 + threadIdx.x] : 0.0f;
    }
    __syncthreads();
    att_warp_product<true>(ks, sm.ldh, qs, sm.ldh, sm.hp / 16, ss, sm.lds, att_tile / 16, false);  // s^T = k q^T
    float p[att_tile / 2];
#pragma unroll
    for (int c = 0; c < att_tile / 2; ++c) {
      const int j = 2 * c + me.half;
      p[c] = m::attention_sees(q0 + j, key, T) ? m::attention_prob(ss[me.row * sm.lds + j], lse_s[j], scale) : 0.0f;
      ps[me.row * sm.ldp + j] = m::store<half_t>(p[c]);
    }
    __syncwarp();
    att_warp_product<false>(ps, sm.ldp, dos, sm.ldh, att_tile / 16, dv, sm.lda, sm.hp / 16, true);  // dv += p^T dout
    att_warp_product<true>(vs, sm.ldh, dos, sm.ldh, sm.hp / 16, ss, sm.lds, att_tile / 16, false);  // dp^T = v dout^T
#pragma unroll
    for (int c = 0; c < att_tile / 2; ++c) {
      const int j = 2 * c + me.half;
      ps[me.row * sm.ldp + j] = m::store<half_t>(m::softmax_grad(p[c], ss[me.row * sm.lds + j], delta_s[j], scale));
    }
    __syncwarp();
    att_warp_product<false>(ps, sm.ldp, qs, sm.ldh, att_tile / 16, dk, sm.lda, sm.hp / 16, true);  // dk += ds^T q
  }
  if (key >= T) return;
  const std::size_t at = (std::size_t(b) * T + key) * ld + std::size_t(h) * hd;
  for (int e = me.half; e < hd; e += 2) {
    const float gk = dk[me.row * sm.lda + e], gv = dv[me.row * sm.lda + e];
    dqkv[at + d + e] = gk;
    dqkv[at + 2 * d + e] = gv;
    dqkv_half[at + d + e] = m::store<half_t>(gk);
    dqkv_half[at + 2 * d + e] = m::store<half_t>(gv);
  }
}

__global__ void __launch_bounds__(att_threads) attention_dq_kernel(const half_t* qkv, const half_t* d_out_half,
                                                                   const float* lse, const float* delta, float* dqkv,
                                                                   half_t* dqkv_half, m::head_layout hl, float scale) {
  extern __shared__ __align__(128) unsigned char att_shared[];
  const att_smem sm = att_dq_smem(hl.head_dim);
  half_t *qs = att_at<half_t>(att_shared, sm.half_at[0]), *dos = att_at<half_t>(att_shared, sm.half_at[1]),
         *ks = att_at<half_t>(att_shared, sm.half_at[2]), *vs = att_at<half_t>(att_shared, sm.half_at[3]),
         *ps = att_at<half_t>(att_shared, sm.p_at);
  float *ss = att_at<float>(att_shared, sm.s_at), *dq = att_at<float>(att_shared, sm.acc_at[0]);
  const int bh = blockIdx.y, b = bh / hl.heads, h = bh - b * hl.heads, T = hl.seq, hd = hl.head_dim, d = hl.d_model();
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * att_tile;  // the longest rows first
  const std::size_t ld = std::size_t(3) * d;
  const half_t* seq_q = qkv + std::size_t(b) * T * ld + std::size_t(h) * hd;
  const half_t* seq_do = d_out_half + std::size_t(b) * T * d + std::size_t(h) * hd;
  const bool vec = att_vec_ok(qkv, ld, h * hd, hd), vec_do = att_vec_ok(d_out_half, std::size_t(d), h * hd, hd);
  att_load_tile(seq_q + std::size_t(q0) * ld, ld, min(att_tile, T - q0), hd, sm, qs, vec);
  att_load_tile(seq_do + std::size_t(q0) * d, std::size_t(d), min(att_tile, T - q0), hd, sm, dos, vec_do);
  for (int i = threadIdx.x; i < att_tile * sm.lda; i += att_threads) dq[i] = 0.0f;
  const att_lane me;
  const int q = q0 + me.row;
  const float row_lse = q < T ? lse[std::size_t(bh) * T + q] : 0.0f, row_delta = q < T ? delta[std::size_t(bh) * T + q] : 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * att_tile;
    __syncthreads();  // the last tile's k and v are read
    att_load_tile(seq_q + d + std::size_t(k0) * ld, ld, min(att_tile, T - k0), hd, sm, ks, vec);
    att_load_tile(seq_q + 2 * d + std::size_t(k0) * ld, ld, min(att_tile, T - k0), hd, sm, vs, vec);
    __syncthreads();
    att_warp_product<true>(qs, sm.ldh, ks, sm.ldh, sm.hp / 16, ss, sm.lds, att_tile / 16, false);  // s = q k^T
    float p[att_tile / 2];
#pragma unroll
    for (int c = 0; c < att_tile / 2; ++c) {
      const int j = 2 * c + me.half;
      p[c] = m::attention_sees(q, k0 + j, T) ? m::attention_prob(ss[me.row * sm.lds + j], row_lse, scale) : 0.0f;
    }
    __syncwarp();  // ss is overwritten next
    att_warp_product<true>(dos, sm.ldh, vs, sm.ldh, sm.hp / 16, ss, sm.lds, att_tile / 16, false);  // dp = dout v^T
#pragma unroll
    for (int c = 0; c < att_tile / 2; ++c) {
      const int j = 2 * c + me.half;
      ps[me.row * sm.ldp + j] = m::store<half_t>(m::softmax_grad(p[c], ss[me.row * sm.lds + j], row_delta, scale));
    }
    __syncwarp();
    att_warp_product<false>(ps, sm.ldp, ks, sm.ldh, att_tile / 16, dq, sm.lda, sm.hp / 16, true);  // dq += ds k
  }
  if (q >= T) return;
  const std::size_t at = (std::size_t(b) * T + q) * ld + std::size_t(h) * hd;
  for (int e = me.half; e < hd; e += 2) {
    const float g = dq[me.row * sm.lda + e];
    dqkv[at + e] = g;
    dqkv_half[at + e] = m::store<half_t>(g);
  }
}

}  // namespace gpt::cuda::kernels

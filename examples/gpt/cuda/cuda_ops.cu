// The GPT's kernels and matmuls on one GPU (cuda_ops.hpp says what each call does). Each kernel
// maps threads to gpt_math.hpp's element or row functions; the mapping is the only thing here:
//   element-wise        grid-stride loops over the flat index
//   row-wise            one warp per row (layer norm, causal softmax) or one block per row
//                       (cross-entropy over the vocabulary), sums by a fixed xor-shuffle tree
//   column sums         one thread per column over a chunk of rows, then the chunks in order
// so every result is deterministic and the host loops (host_ops.hpp) are the same math.
#include "cuda_ops.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../ops_contract.hpp"
#include "zshard/backend/cuda_check.hpp"

namespace gpt::cuda {

namespace {

using half_t = zshard::bf16;
namespace m = gpt::math;

constexpr int threads = 256;
constexpr int warps_per_block = threads / 32;
constexpr unsigned full_mask = 0xffffffffu;

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>((n + threads - 1) / threads, 1, 16384));
}
unsigned row_blocks(int rows) { return static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block); }

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

// ---- embedding ----------------------------------------------------------------------------------
__global__ void embed_forward_kernel(const std::int32_t* tokens, const half_t* wte, const half_t* wpe, float* x,
                                     std::size_t n, int seq, int d) {
  for (std::size_t i = first(); i < n; i += stride()) {
    const std::size_t r = i / d, j = i % d;
    x[i] = m::load(wte[std::size_t(tokens[r]) * d + j]) + m::load(wpe[(r % seq) * d + j]);
  }
}
// dwte[tok] += the rows of tok in row order (one thread per (distinct token, column)).
__global__ void embed_backward_tokens_kernel(const std::int32_t* by_row, const std::int32_t* uniq,
                                             const std::int32_t* offsets, int n_uniq, const float* dx, float* dwte,
                                             int d) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  for (int u = blockIdx.y; u < n_uniq; u += gridDim.y) {
    float* out = dwte + std::size_t(uniq[u]) * d + j;
    float acc = *out;
    for (int i = offsets[u]; i < offsets[u + 1]; ++i) acc += dx[std::size_t(by_row[i]) * d + j];
    *out = acc;
  }
}
__global__ void embed_backward_positions_kernel(const float* dx, float* dwpe, int batch, int seq, int d) {
  for (std::size_t i = first(); i < std::size_t(seq) * d; i += stride()) {
    const std::size_t t = i / d, j = i % d;
    float acc = dwpe[i];
    for (int b = 0; b < batch; ++b) acc += dx[(std::size_t(b) * seq + t) * d + j];
    dwpe[i] = acc;
  }
}

// ---- layer norm: one warp per row ---------------------------------------------------------------
// With `branch`: the row is first (branch + branch_bias) + x, stored to `sum` (the residual).
__global__ void layer_norm_forward_kernel(const float* x, const float* branch, const half_t* branch_bias, float* sum,
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
__global__ void layer_norm_backward_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
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

// ---- column sums: chunk partials, then the chunks in order ----------------------------------------
// layer norm's parameter gradients (two sums) when x is given, else one plain column sum of dy.
__global__ void column_partial_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                      float* partial, int rows, int cols, int chunks) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
  if (j >= cols) return;
  const int begin = ch * ops::column_sum_rows_per_chunk;
  const int end = min(rows, begin + ops::column_sum_rows_per_chunk);
  float a = 0, b = 0;
  for (int r = begin; r < end; ++r) {
    const float v = dy[std::size_t(r) * cols + j];
    if (x) {
      a += v * m::layer_norm_xhat(x[std::size_t(r) * cols + j], mean[r], rstd[r]);
      b += v;
    } else {
      a += v;
    }
  }
  partial[std::size_t(ch) * cols + j] = a;
  if (x) partial[std::size_t(chunks + ch) * cols + j] = b;
}
__global__ void column_finish_kernel(const float* partial, float* out0, float* out1, int cols, int chunks) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float a = 0, b = 0;
  for (int ch = 0; ch < chunks; ++ch) {
    a += partial[std::size_t(ch) * cols + j];
    if (out1) b += partial[std::size_t(chunks + ch) * cols + j];
  }
  out0[j] += a;
  if (out1) out1[j] += b;
}

// ---- GELU -----------------------------------------------------------------------------------------
__global__ void bias_gelu_forward_kernel(float* pre, const half_t* bias, half_t* act, std::size_t n, int cols) {
  for (std::size_t i = first(); i < n; i += stride()) {
    const float v = pre[i] + m::load(bias[i % cols]);
    pre[i] = v;
    act[i] = m::store<half_t>(m::gelu_forward(v));
  }
}
__global__ void gelu_forward_kernel(const float* pre, half_t* act, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride()) act[i] = m::store<half_t>(m::gelu_forward(pre[i]));
}
__global__ void gelu_backward_kernel(const float* pre, float* d, half_t* d_half, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride()) {
    const float g = m::gelu_backward(pre[i], d[i]);
    d[i] = g;
    d_half[i] = m::store<half_t>(g);
  }
}

// ---- attention layouts ------------------------------------------------------------------------------
__global__ void qkv_bias_permute_kernel(const float* qkv, const half_t* bias, half_t* q, half_t* k, half_t* v,
                                        m::head_layout hl) {
  const int d = hl.d_model();
  const std::size_t n = std::size_t(hl.batch) * hl.seq * 3 * d;
  for (std::size_t i = first(); i < n; i += stride()) {
    const std::size_t r = i / (3 * d);
    const int c = int(i % (3 * d)), which = c / d, h = (c % d) / hl.head_dim, e = c % hl.head_dim;
    const int b = int(r / hl.seq), t = int(r % hl.seq);
    half_t* dst = which == 0 ? q : which == 1 ? k : v;
    dst[hl.head_index(b, h, t, e)] = m::store<half_t>(qkv[i] + m::load(bias[c]));
  }
}
// Row-major [N, d] index i <-> [B, H, T, hd]: f(i, head index).
template <class F>
__device__ void for_rows_and_heads(const m::head_layout& hl, F&& f) {
  const int d = hl.d_model();
  const std::size_t n = std::size_t(hl.batch) * hl.seq * d;
  for (std::size_t i = first(); i < n; i += stride()) {
    const std::size_t r = i / d;
    const int c = int(i % d);
    f(i, hl.head_index(int(r / hl.seq), c / hl.head_dim, int(r % hl.seq), c % hl.head_dim));
  }
}
__global__ void heads_to_rows_kernel(const float* o, half_t* out, m::head_layout hl) {
  for_rows_and_heads(hl, [&](std::size_t i, std::size_t h) { out[i] = m::store<half_t>(o[h]); });
}
__global__ void rows_to_heads_kernel(const float* d_out, half_t* d_o, m::head_layout hl) {
  for_rows_and_heads(hl, [&](std::size_t i, std::size_t h) { d_o[h] = m::store<half_t>(d_out[i]); });
}
__global__ void qkv_grad_to_rows_kernel(const float* dq, const float* dk, const float* dv, float* dqkv,
                                        half_t* dqkv_half, m::head_layout hl) {
  const int d = hl.d_model();
  const std::size_t n = std::size_t(hl.batch) * hl.seq * 3 * d;
  for (std::size_t i = first(); i < n; i += stride()) {
    const std::size_t r = i / (3 * d);
    const int c = int(i % (3 * d)), which = c / d, h = (c % d) / hl.head_dim, e = c % hl.head_dim;
    const float* src = which == 0 ? dq : which == 1 ? dk : dv;
    const float g = src[hl.head_index(int(r / hl.seq), h, int(r % hl.seq), e)];
    dqkv[i] = g;
    dqkv_half[i] = m::store<half_t>(g);
  }
}

// ---- causal softmax: one warp per row of [B*H*T, T]; row r is query t = r % T --------------------------
__global__ void causal_softmax_forward_kernel(const float* s, half_t* p, int rows, int seq, float scale) {
  const int row = blockIdx.x * warps_per_block + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* sr = s + std::size_t(row) * seq;
  half_t* pr = p + std::size_t(row) * seq;
  const int seen = row % seq + 1;
  float mx = -INFINITY;
  for (int j = lane; j < seen; j += 32) mx = fmaxf(mx, sr[j]);
  mx = warp_max(mx);
  float sum = 0;
  for (int j = lane; j < seen; j += 32) sum += m::softmax_numerator(sr[j], mx, scale);
  sum = warp_sum(sum);
  for (int j = lane; j < seq; j += 32)
    pr[j] = m::store<half_t>(j < seen ? m::softmax_numerator(sr[j], mx, scale) / sum : 0.0f);
}
__global__ void causal_softmax_backward_kernel(const half_t* p, const float* dp, half_t* ds, int rows, int seq,
                                               float scale) {
  const int row = blockIdx.x * warps_per_block + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const half_t* pr = p + std::size_t(row) * seq;
  const float* dpr = dp + std::size_t(row) * seq;
  const int seen = row % seq + 1;
  float dot = 0;
  for (int j = lane; j < seen; j += 32) dot += m::load(pr[j]) * dpr[j];
  dot = warp_sum(dot);  // every lane has read its p before any lane writes ds (ds may alias p)
  half_t* dsr = ds + std::size_t(row) * seq;
  for (int j = lane; j < seq; j += 32)
    dsr[j] = m::store<half_t>(j < seen ? m::softmax_grad(m::load(pr[j]), dpr[j], dot, scale) : 0.0f);
}

// ---- residual, casts, loss ----------------------------------------------------------------------------
__global__ void residual_add_kernel(const float* x, const float* branch, const half_t* bias, float* out, std::size_t n,
                                    int cols) {
  for (std::size_t i = first(); i < n; i += stride()) out[i] = (branch[i] + m::load(bias[i % cols])) + x[i];
}
__global__ void to_half_kernel(const float* src, half_t* dst, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride()) dst[i] = m::store<half_t>(src[i]);
}
// One block per row of logits.
__global__ void cross_entropy_kernel(const float* logits, const std::int32_t* targets, float* row_loss,
                                     half_t* dlogits, float w, int vocab) {
  __shared__ float shared[32];
  const std::size_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_reduce<true>(mx, shared);
  float sum = 0;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(l[j] - mx);
  sum = block_reduce<false>(sum, shared);
  const int target = targets[row];
  if (threadIdx.x == 0) row_loss[row] = m::cross_entropy_loss(sum, mx, l[target]);
  if (!dlogits) return;
  half_t* g = dlogits + row * vocab;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x)
    g[j] = m::store<half_t>(m::cross_entropy_grad(l[j], mx, sum, w, j == target));
}

__global__ void fill_pattern_kernel(half_t* x, std::size_t n) {
  for (std::size_t i = first(); i < n; i += stride())
    x[i] = m::store<half_t>(float(int((i * 2654435761u) % 2001u) - 1000) * 1e-3f);
}

void launched(const char* what) { zshard::cuda::check(cudaGetLastError(), std::string("launch of ") + what); }

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw zshard::error(zshard::error_kind::backend, std::string(what) + " failed: " + cublasGetStatusString(s),
                        "check the GEMM's sizes and leading dimensions, and that the device has memory left");
}

}  // namespace

// ---- the object -----------------------------------------------------------------------------------------
struct cuda_ops::impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Uploads go through a ring of pinned slots, each reused only after its last copy finished.
  struct slot {
    void* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  std::vector<slot> ring = std::vector<slot>(8);
  std::size_t next = 0;
  slot down;  // downloads

  void wait(cudaEvent_t e) const {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t s = cudaEventQuery(e);
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady) zshard::cuda::check(s, "cudaEventQuery (gpt cuda_ops)");
      if (std::chrono::steady_clock::now() - start > std::chrono::minutes(5))
        throw zshard::error(zshard::error_kind::backend, "gpt cuda_ops: the stream did not reach a copy within 5 minutes",
                            "a collective ahead of it may wait for a rank that failed");
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  void fit(slot& s, std::size_t bytes) {
    if (s.done) wait(s.done);
    if (s.bytes >= bytes) return;
    if (s.host) zshard::cuda::check(cudaFreeHost(s.host), "cudaFreeHost");
    s.host = nullptr;
    s.bytes = 0;
    zshard::cuda::check(cudaHostAlloc(&s.host, bytes, cudaHostAllocDefault), "cudaHostAlloc (gpt staging)");
    s.bytes = bytes;
  }
};

cuda_ops::cuda_ops(int device, cudaStream_t stream, std::size_t cublas_workspace) : impl_(std::make_unique<impl>()) {
  impl_->device = device;
  impl_->stream = stream;
  zshard::cuda::ensure_device(device);
  cublas_check(cublasCreate(&impl_->blas), "cublasCreate");
  cublas_check(cublasSetStream(impl_->blas, stream), "cublasSetStream");
  if (cublas_workspace) {
    zshard::cuda::check(cudaMalloc(&impl_->workspace, cublas_workspace), "cudaMalloc (cuBLAS workspace)");
    impl_->workspace_bytes = cublas_workspace;
    cublas_check(cublasSetWorkspace(impl_->blas, impl_->workspace, cublas_workspace), "cublasSetWorkspace");
  }
  for (auto& s : impl_->ring) zshard::cuda::check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate");
  zshard::cuda::check(cudaEventCreateWithFlags(&impl_->down.done, cudaEventDisableTiming), "cudaEventCreate");
}

cuda_ops::~cuda_ops() {
  if (!impl_) return;
  (void)cudaSetDevice(impl_->device);
  (void)cudaStreamSynchronize(impl_->stream);  // staging may still be read by a copy
  for (auto* s : {&impl_->down}) {
    if (s->host) (void)cudaFreeHost(s->host);
    if (s->done) (void)cudaEventDestroy(s->done);
  }
  for (auto& s : impl_->ring) {
    if (s.host) (void)cudaFreeHost(s.host);
    if (s.done) (void)cudaEventDestroy(s.done);
  }
  if (impl_->blas) (void)cublasDestroy(impl_->blas);
  if (impl_->workspace) (void)cudaFree(impl_->workspace);
}

cudaStream_t cuda_ops::stream() const noexcept { return impl_->stream; }
std::size_t cuda_ops::workspace_bytes() const noexcept { return impl_->workspace_bytes; }

void* cuda_ops::allocate(std::size_t bytes) {
  zshard::cuda::ensure_device(impl_->device);
  void* p = nullptr;
  zshard::cuda::check(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes, GPT activations)");
  return p;
}
void cuda_ops::deallocate(void* p) noexcept {
  if (!p) return;
  (void)cudaStreamSynchronize(impl_->stream);  // cudaFree would too; the arena's last users are on the stream
  (void)cudaFree(p);
}
void cuda_ops::zero(void* p, std::size_t bytes) {
  zshard::cuda::check(cudaMemsetAsync(p, 0, bytes, impl_->stream), "cudaMemsetAsync");
}
void cuda_ops::upload(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  auto& s = impl_->ring[impl_->next++ % impl_->ring.size()];
  impl_->fit(s, bytes);
  std::memcpy(s.host, src, bytes);
  zshard::cuda::check(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, impl_->stream), "cudaMemcpyAsync (upload)");
  zshard::cuda::check(cudaEventRecord(s.done, impl_->stream), "cudaEventRecord");
}
void cuda_ops::download(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  auto& s = impl_->down;
  impl_->fit(s, bytes);
  zshard::cuda::check(cudaMemcpyAsync(s.host, src, bytes, cudaMemcpyDeviceToHost, impl_->stream), "cudaMemcpyAsync (download)");
  zshard::cuda::check(cudaEventRecord(s.done, impl_->stream), "cudaEventRecord");
  impl_->wait(s.done);
  std::memcpy(dst, s.host, bytes);
}

void cuda_ops::gemm(bool ta, bool tb, int m_, int n, int k, const half_t* A, int lda, long long sa, const half_t* B,
                    int ldb, long long sb, float* C, int ldc, long long sc, int batch, float beta) {
  const float alpha = 1.0f;
  const auto opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1)
    cublas_check(cublasGemmEx(impl_->blas, opa, opb, m_, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C,
                              CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  else
    cublas_check(cublasGemmStridedBatchedEx(impl_->blas, opa, opb, m_, n, k, &alpha, A, CUDA_R_16BF, lda, sa, B,
                                            CUDA_R_16BF, ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
}

double cuda_ops::gemm_flops_per_s(int n, int reps) {
  const std::size_t nn = std::size_t(n) * std::size_t(n);
  half_t* a = static_cast<half_t*>(allocate(nn * sizeof(half_t)));
  half_t* b = static_cast<half_t*>(allocate(nn * sizeof(half_t)));
  float* c = static_cast<float*>(allocate(nn * sizeof(float)));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double best = std::numeric_limits<double>::infinity();
  try {
    fill_pattern_kernel<<<blocks_for(nn), threads, 0, impl_->stream>>>(a, nn);
    fill_pattern_kernel<<<blocks_for(nn), threads, 0, impl_->stream>>>(b, nn);
    launched("fill_pattern");
    zshard::cuda::check(cudaEventCreate(&e0), "cudaEventCreate");
    zshard::cuda::check(cudaEventCreate(&e1), "cudaEventCreate");
    gemm(false, false, n, n, n, a, n, 0, b, n, 0, c, n, 0, 1, 0.0f);  // warm-up: heuristics, lazy loading
    for (int r = 0; r < reps; ++r) {
      zshard::cuda::check(cudaEventRecord(e0, impl_->stream), "cudaEventRecord");
      gemm(false, false, n, n, n, a, n, 0, b, n, 0, c, n, 0, 1, 0.0f);
      zshard::cuda::check(cudaEventRecord(e1, impl_->stream), "cudaEventRecord");
      impl_->wait(e1);
      float ms = 0;
      zshard::cuda::check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      best = std::min(best, double(ms));
    }
  } catch (...) {
    if (e0) (void)cudaEventDestroy(e0);
    if (e1) (void)cudaEventDestroy(e1);
    deallocate(a), deallocate(b), deallocate(c);
    throw;
  }
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  deallocate(a), deallocate(b), deallocate(c);
  return 2.0 * double(n) * double(n) * double(n) / (best * 1e-3);
}

// ---- launches --------------------------------------------------------------------------------------------
void cuda_ops::embed_forward(const std::int32_t* tokens, const half_t* wte, const half_t* wpe, float* x, int batch,
                             int seq, int d) {
  const std::size_t n = std::size_t(batch) * seq * d;
  embed_forward_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(tokens, wte, wpe, x, n, seq, d);
  launched("embed_forward");
}
void cuda_ops::embed_backward(const std::int32_t* by_row, const std::int32_t* uniq, const std::int32_t* offsets,
                              int n_uniq, const float* dx, float* dwte, float* dwpe, int batch, int seq, int d) {
  if (n_uniq > 0) {
    const dim3 grid(unsigned((d + threads - 1) / threads), unsigned(std::min(n_uniq, 65535)));
    embed_backward_tokens_kernel<<<grid, threads, 0, impl_->stream>>>(by_row, uniq, offsets, n_uniq, dx, dwte, d);
    launched("embed_backward (tokens)");
  }
  embed_backward_positions_kernel<<<blocks_for(std::size_t(seq) * d), threads, 0, impl_->stream>>>(dx, dwpe, batch, seq, d);
  launched("embed_backward (positions)");
}
void cuda_ops::layer_norm_forward(const float* x, const half_t* gain, const half_t* bias, half_t* y, float* mean,
                                  float* rstd, int rows, int d) {
  layer_norm_forward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(x, nullptr, nullptr, nullptr, gain, bias, y,
                                                                              mean, rstd, rows, d);
  launched("layer_norm_forward");
}
void cuda_ops::residual_layer_norm_forward(const float* x, const float* branch, const half_t* branch_bias, float* sum,
                                           const half_t* gain, const half_t* bias, half_t* y, float* mean, float* rstd,
                                           int rows, int d) {
  layer_norm_forward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(x, branch, branch_bias, sum, gain, bias, y,
                                                                              mean, rstd, rows, d);
  launched("residual_layer_norm_forward");
}
void cuda_ops::layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                                   const half_t* gain, float* dx, int rows, int d) {
  layer_norm_backward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(dy, x, mean, rstd, gain, dx, rows, d);
  launched("layer_norm_backward");
}
void cuda_ops::layer_norm_param_grad(const float* dy, const float* x, const float* mean, const float* rstd,
                                     float* dgain, float* dbias, int rows, int d) {
  const int chunks = int(ops::column_sum_chunks(rows));
  const dim3 grid(unsigned((d + threads - 1) / threads), unsigned(chunks));
  column_partial_kernel<<<grid, threads, 0, impl_->stream>>>(dy, x, mean, rstd, col_scratch, rows, d, chunks);
  column_finish_kernel<<<unsigned((d + threads - 1) / threads), threads, 0, impl_->stream>>>(col_scratch, dgain, dbias, d,
                                                                                             chunks);
  launched("layer_norm_param_grad");
}
void cuda_ops::bias_grad(const float* dy, float* dbias, int rows, int cols) {
  const int chunks = int(ops::column_sum_chunks(rows));
  const dim3 grid(unsigned((cols + threads - 1) / threads), unsigned(chunks));
  column_partial_kernel<<<grid, threads, 0, impl_->stream>>>(dy, nullptr, nullptr, nullptr, col_scratch, rows, cols,
                                                             chunks);
  column_finish_kernel<<<unsigned((cols + threads - 1) / threads), threads, 0, impl_->stream>>>(col_scratch, dbias,
                                                                                                nullptr, cols, chunks);
  launched("bias_grad");
}
void cuda_ops::bias_gelu_forward(float* pre, const half_t* bias, half_t* act, int rows, int cols) {
  const std::size_t n = std::size_t(rows) * cols;
  bias_gelu_forward_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(pre, bias, act, n, cols);
  launched("bias_gelu_forward");
}
void cuda_ops::gelu_forward(const float* pre, half_t* act, std::size_t n) {
  gelu_forward_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(pre, act, n);
  launched("gelu_forward");
}
void cuda_ops::gelu_backward(const float* pre, float* d, half_t* d_half, std::size_t n) {
  gelu_backward_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(pre, d, d_half, n);
  launched("gelu_backward");
}
void cuda_ops::qkv_bias_permute(const float* qkv, const half_t* bias, half_t* q, half_t* k, half_t* v,
                                const math::head_layout& hl) {
  const std::size_t n = std::size_t(hl.batch) * hl.seq * 3 * hl.d_model();
  qkv_bias_permute_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(qkv, bias, q, k, v, hl);
  launched("qkv_bias_permute");
}
void cuda_ops::causal_softmax_forward(const float* s, half_t* p, int rows, int seq, float scale) {
  causal_softmax_forward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(s, p, rows, seq, scale);
  launched("causal_softmax_forward");
}
void cuda_ops::causal_softmax_backward(const half_t* p, const float* dp, half_t* ds, int rows, int seq, float scale) {
  causal_softmax_backward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(p, dp, ds, rows, seq, scale);
  launched("causal_softmax_backward");
}
void cuda_ops::heads_to_rows(const float* o, half_t* out, const math::head_layout& hl) {
  heads_to_rows_kernel<<<blocks_for(std::size_t(hl.batch) * hl.seq * hl.d_model()), threads, 0, impl_->stream>>>(o, out, hl);
  launched("heads_to_rows");
}
void cuda_ops::rows_to_heads(const float* d_out, half_t* d_o, const math::head_layout& hl) {
  rows_to_heads_kernel<<<blocks_for(std::size_t(hl.batch) * hl.seq * hl.d_model()), threads, 0, impl_->stream>>>(d_out, d_o,
                                                                                                                 hl);
  launched("rows_to_heads");
}
void cuda_ops::qkv_grad_to_rows(const float* dq, const float* dk, const float* dv, float* dqkv, half_t* dqkv_half,
                                const math::head_layout& hl) {
  const std::size_t n = std::size_t(hl.batch) * hl.seq * 3 * hl.d_model();
  qkv_grad_to_rows_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(dq, dk, dv, dqkv, dqkv_half, hl);
  launched("qkv_grad_to_rows");
}
void cuda_ops::residual_add(const float* x, const float* branch, const half_t* bias, float* out, int rows, int cols) {
  const std::size_t n = std::size_t(rows) * cols;
  residual_add_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(x, branch, bias, out, n, cols);
  launched("residual_add");
}
void cuda_ops::to_half(const float* src, half_t* dst, std::size_t n) {
  to_half_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(src, dst, n);
  launched("to_half");
}
void cuda_ops::cross_entropy(const float* logits, const std::int32_t* targets, float* row_loss, half_t* dlogits,
                             float grad_weight, int rows, int vocab) {
  cross_entropy_kernel<<<unsigned(rows), 512, 0, impl_->stream>>>(logits, targets, row_loss, dlogits, grad_weight, vocab);
  launched("cross_entropy");
}

}  // namespace gpt::cuda

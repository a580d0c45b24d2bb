// The GPT's operations on one GPU (cuda_ops.hpp says what each call does): launches of the
// kernels in gpt_kernels.cuh, cuBLAS for the matmuls, pinned staging for host copies.
#include "cuda_ops.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../ops_contract.hpp"
#include "attention_kernels.cuh"
#include "gpt_kernels.cuh"
#include "zshard/backend/cuda_check.hpp"

namespace gpt::cuda {

namespace {

using namespace kernels;

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
  std::size_t smem_optin = 0;  // shared memory a block may opt into on this device
  std::chrono::milliseconds timeout{300'000};  // every host wait, teardown's included
  // Uploads go through a ring of pinned slots, each reused only after its last copy finished;
  // the model sizes them once (reserve_staging), so a step never allocates or frees pinned
  // memory (cudaFreeHost synchronises the device).
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
      if (std::chrono::steady_clock::now() - start > timeout)
        throw zshard::error(zshard::error_kind::backend,
                            "gpt cuda_ops: the stream did not reach a copy within " + std::to_string(timeout.count()) + " ms",
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

cuda_ops::cuda_ops(int device, cudaStream_t stream, std::size_t cublas_workspace, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
  impl_->device = device;
  impl_->stream = stream;
  impl_->timeout = timeout;
  zshard::cuda::ensure_device(device);
  cublas_check(cublasCreate(&impl_->blas), "cublasCreate");
  cublas_check(cublasSetStream(impl_->blas, stream), "cublasSetStream");
  if (cublas_workspace) {
    zshard::cuda::check(cudaMallocAsync(&impl_->workspace, cublas_workspace, stream), "cudaMallocAsync (cuBLAS workspace)");
    impl_->workspace_bytes = cublas_workspace;
    cublas_check(cublasSetWorkspace(impl_->blas, impl_->workspace, cublas_workspace), "cublasSetWorkspace");
  }
  for (auto& s : impl_->ring) zshard::cuda::check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate");
  // The attention kernels take more than the default 48 KiB of shared memory: allow what the
  // largest head needs (a launch uses what its head needs, which sets its occupancy).
  const int largest = math::attention_max_head_dim;
  const std::pair<const void*, std::size_t> attention[] = {
      {reinterpret_cast<const void*>(&attention_forward_kernel), att_forward_smem(largest).bytes},
      {reinterpret_cast<const void*>(&attention_dkdv_kernel), att_dkdv_smem(largest).bytes},
      {reinterpret_cast<const void*>(&attention_dq_kernel), att_dq_smem(largest).bytes}};
  int optin = 0;
  zshard::cuda::check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                      "cudaDeviceGetAttribute(shared memory per block)");
  for (const auto& [kernel, bytes] : attention)
    zshard::cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(std::min<std::size_t>(bytes, std::size_t(optin)))),
                        "cudaFuncSetAttribute (attention shared memory)");
  impl_->smem_optin = std::size_t(optin);
  zshard::cuda::check(cudaEventCreateWithFlags(&impl_->down.done, cudaEventDisableTiming), "cudaEventCreate");
}

// Teardown waits for the stream at most `timeout` (staging may still be read by a copy). A
// stream that does not drain (a collective ahead of it waits for a failed rank) leaves the
// pinned staging and the cuBLAS handle allocated rather than hang: cudaFreeHost and
// cublasDestroy synchronise the device. Device memory is freed in stream order, never waited for.
cuda_ops::~cuda_ops() {
  if (!impl_) return;
  (void)cudaSetDevice(impl_->device);
  bool drained = false;
  try {
    zshard::cuda::check(cudaEventRecord(impl_->down.done, impl_->stream), "cudaEventRecord");
    impl_->wait(impl_->down.done);
    drained = true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt cuda_ops: teardown leaves its pinned staging and cuBLAS handle allocated: %s\n", e.what());
  }
  if (impl_->workspace) (void)cudaFreeAsync(impl_->workspace, impl_->stream);
  if (!drained) return;
  for (auto* s : {&impl_->down}) {
    if (s->host) (void)cudaFreeHost(s->host);
    if (s->done) (void)cudaEventDestroy(s->done);
  }
  for (auto& s : impl_->ring) {
    if (s.host) (void)cudaFreeHost(s.host);
    if (s.done) (void)cudaEventDestroy(s.done);
  }
  if (impl_->blas) (void)cublasDestroy(impl_->blas);
}

cudaStream_t cuda_ops::stream() const noexcept { return impl_->stream; }
std::size_t cuda_ops::workspace_bytes() const noexcept { return impl_->workspace_bytes; }

// Stream-ordered, from the device's default pool (not the backend's): freeing never waits for
// the stream, and the arena's last users are on it.
void* cuda_ops::allocate(std::size_t bytes) {
  zshard::cuda::ensure_device(impl_->device);
  void* p = nullptr;
  zshard::cuda::check(cudaMallocAsync(&p, bytes, impl_->stream),
                      "cudaMallocAsync(" + std::to_string(bytes) + " bytes, GPT activations)");
  return p;
}
void cuda_ops::deallocate(void* p) noexcept {
  if (p) (void)cudaFreeAsync(p, impl_->stream);
}
void cuda_ops::reserve_staging(std::size_t upload_bytes, std::size_t download_bytes) {
  for (auto& s : impl_->ring) impl_->fit(s, upload_bytes);
  impl_->fit(impl_->down, download_bytes);
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
  const dim3 grid(unsigned((d + threads - 1) / threads), unsigned(std::clamp(seq, 1, 65535)),
                  unsigned(std::clamp(batch, 1, 65535)));
  embed_forward_kernel<<<grid, threads, 0, impl_->stream>>>(tokens, wte, wpe, x, batch, seq, d);
  launched("embed_forward");
}
void cuda_ops::embed_backward(const ops::token_chunks& tc, const float* dx, float* dwte, float* dwpe, int batch, int seq,
                              int d) {
  const unsigned columns = unsigned((d + threads - 1) / threads);
  if (tc.chunks > 0) {
    embed_backward_chunks_kernel<<<dim3(columns, unsigned(std::min(tc.chunks, 65535))), threads, 0, impl_->stream>>>(
        tc, dx, dwte, d);
    launched("embed_backward (token chunks)");
  }
  if (tc.multi > 0) {
    embed_backward_multi_kernel<<<dim3(columns, unsigned(std::min(tc.multi, 65535))), threads, 0, impl_->stream>>>(tc, dwte,
                                                                                                                d);
    launched("embed_backward (tokens of several chunks)");
  }
  embed_backward_positions_kernel<<<grid_2d(seq, d), threads, 0, impl_->stream>>>(dx, dwpe, batch, seq, d);
  launched("embed_backward (positions)");
}
void cuda_ops::layer_norm_forward(const float* x, const half_t* gain, const half_t* bias, half_t* y, float* mean,
                                  float* rstd, int rows, int d) {
  if (!with_register_row(d, [&](auto k) {
        layer_norm_forward_regs_kernel<k()><<<row_blocks(rows), threads, 0, impl_->stream>>>(
            x, nullptr, nullptr, nullptr, gain, bias, y, mean, rstd, rows, d);
      }))
    layer_norm_forward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(x, nullptr, nullptr, nullptr, gain, bias,
                                                                                y, mean, rstd, rows, d);
  launched("layer_norm_forward");
}
void cuda_ops::residual_layer_norm_forward(const float* x, const float* branch, const half_t* branch_bias, float* sum,
                                           const half_t* gain, const half_t* bias, half_t* y, float* mean, float* rstd,
                                           int rows, int d) {
  if (!with_register_row(d, [&](auto k) {
        layer_norm_forward_regs_kernel<k()><<<row_blocks(rows), threads, 0, impl_->stream>>>(
            x, branch, branch_bias, sum, gain, bias, y, mean, rstd, rows, d);
      }))
    layer_norm_forward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(x, branch, branch_bias, sum, gain, bias,
                                                                                y, mean, rstd, rows, d);
  launched("residual_layer_norm_forward");
}
void cuda_ops::layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                                   const half_t* gain, float* dx, int rows, int d) {
  if (!with_register_row(d, [&](auto k) {
        layer_norm_backward_regs_kernel<k()><<<row_blocks(rows), threads, 0, impl_->stream>>>(dy, x, mean, rstd, gain,
                                                                                               dx, rows, d);
      }))
    layer_norm_backward_kernel<<<row_blocks(rows), threads, 0, impl_->stream>>>(dy, x, mean, rstd, gain, dx, rows, d);
  launched("layer_norm_backward");
}
void cuda_ops::layer_norm_param_grad(const float* dy, const float* x, const float* mean, const float* rstd,
                                     float* dgain, float* dbias, int rows, int d) {
  const int chunks = int(ops::column_sum_chunks(rows));
  const unsigned columns = unsigned((d + 31) / 32);  // blocks of 32 columns x column_sum_lanes lanes
  column_partial_kernel<<<dim3(columns, unsigned(chunks)), threads, 0, impl_->stream>>>(dy, x, mean, rstd, col_scratch,
                                                                                       rows, d, chunks);
  column_finish_kernel<<<columns, threads, 0, impl_->stream>>>(col_scratch, dgain, dbias, d, chunks);
  launched("layer_norm_param_grad");
}
void cuda_ops::bias_grad(const float* dy, float* dbias, int rows, int cols) {
  const int chunks = int(ops::column_sum_chunks(rows));
  const unsigned columns = unsigned((cols + 31) / 32);
  column_partial_kernel<<<dim3(columns, unsigned(chunks)), threads, 0, impl_->stream>>>(dy, nullptr, nullptr, nullptr,
                                                                                       col_scratch, rows, cols, chunks);
  column_finish_kernel<<<columns, threads, 0, impl_->stream>>>(col_scratch, dbias, nullptr, cols, chunks);
  launched("bias_grad");
}
void cuda_ops::bias_gelu_forward(float* pre, const half_t* bias, half_t* act, int rows, int cols) {
  bias_gelu_forward_kernel<<<grid_2d(rows, cols), threads, 0, impl_->stream>>>(pre, bias, act, rows, cols);
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
void cuda_ops::bias_to_half(const float* x, const half_t* bias, half_t* y, int rows, int cols) {
  bias_to_half_kernel<<<grid_2d(rows, cols), threads, 0, impl_->stream>>>(x, bias, y, rows, cols);
  launched("bias_to_half");
}
namespace {
// The attention kernels' grid: one block per 64-row tile of each (sequence, head).
dim3 attention_grid(const math::head_layout& hl) {
  return dim3(unsigned((hl.seq + att_tile - 1) / att_tile), unsigned(hl.batch * hl.heads));
}
// The head fits the kernels, and the block's shared memory fits the device.
std::size_t attention_smem(const math::head_layout& hl, const att_smem& sm, std::size_t optin) {
  if (hl.head_dim < 1 || hl.head_dim > math::attention_max_head_dim)
    throw zshard::error(zshard::error_kind::usage,
                        "gpt cuda_ops: the fused attention holds heads of up to " +
                            std::to_string(math::attention_max_head_dim) + " elements, got " + std::to_string(hl.head_dim),
                        "use more heads (d_model / n_heads <= 128)");
  if (sm.bytes > optin)
    throw zshard::error(zshard::error_kind::usage,
                        "gpt cuda_ops: the fused attention needs " + std::to_string(sm.bytes) +
                            " bytes of shared memory per block for heads of " + std::to_string(hl.head_dim) +
                            " elements; this device allows " + std::to_string(optin),
                        "use smaller heads (more of them)");
  return sm.bytes;
}
}  // namespace
void cuda_ops::attention_forward(const half_t* qkv, half_t* out, float* lse, const math::head_layout& hl, float scale) {
  const std::size_t smem = attention_smem(hl, att_forward_smem(hl.head_dim), impl_->smem_optin);
  attention_forward_kernel<<<attention_grid(hl), att_threads, smem, impl_->stream>>>(qkv, out, lse, hl, scale);
  launched("attention_forward");
}
void cuda_ops::attention_backward_prepare(const float* d_out, const half_t* out, half_t* d_out_half, float* delta,
                                          const math::head_layout& hl) {
  attention_delta_kernel<<<unsigned(hl.batch * hl.seq), threads, 0, impl_->stream>>>(d_out, out, d_out_half, delta, hl);
  launched("attention_backward_prepare");
}
void cuda_ops::attention_backward(const half_t* qkv, const half_t* d_out_half, const float* lse, const float* delta,
                                  float* dqkv, half_t* dqkv_half, const math::head_layout& hl, float scale) {
  const std::size_t dkdv = attention_smem(hl, att_dkdv_smem(hl.head_dim), impl_->smem_optin),
                    dq = attention_smem(hl, att_dq_smem(hl.head_dim), impl_->smem_optin);
  attention_dkdv_kernel<<<attention_grid(hl), att_threads, dkdv, impl_->stream>>>(qkv, d_out_half, lse, delta, dqkv,
                                                                                  dqkv_half, hl, scale);
  launched("attention_backward (dk, dv)");
  attention_dq_kernel<<<attention_grid(hl), att_threads, dq, impl_->stream>>>(qkv, d_out_half, lse, delta, dqkv,
                                                                              dqkv_half, hl, scale);
  launched("attention_backward (dq)");
}
void cuda_ops::residual_add(const float* x, const float* branch, const half_t* bias, float* out, int rows, int cols) {
  residual_add_kernel<<<grid_2d(rows, cols), threads, 0, impl_->stream>>>(x, branch, bias, out, rows, cols);
  launched("residual_add");
}
void cuda_ops::to_half(const float* src, half_t* dst, std::size_t n) {
  to_half_kernel<<<blocks_for(n), threads, 0, impl_->stream>>>(src, dst, n);
  launched("to_half");
}
void cuda_ops::cross_entropy(const float* logits, const std::int32_t* targets, float* row_loss, half_t* dlogits,
                             float grad_weight, int rows, int vocab) {
  cross_entropy_kernel<<<unsigned(rows), ce_threads, 0, impl_->stream>>>(logits, targets, row_loss, dlogits, grad_weight,
                                                                        vocab);
  launched("cross_entropy");
}

}  // namespace gpt::cuda

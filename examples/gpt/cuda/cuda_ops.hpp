#pragma once
// The GPT's operations (ops_contract.hpp) on one GPU: the project's own kernels for everything
// but the matmuls, which go to cuBLAS in bf16 with f32 accumulation (cublasGemmEx /
// cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F). Every call enqueues on the stream given at
// construction (the engine's compute stream) and returns at once, except download() and the
// GEMM rate measurement, which wait.
//
// The kernels are thin launches of gpt_math.hpp's and attention_math.hpp's functions (the ones
// the CPU tests check), in one nvcc translation unit (cuda_ops.cu, the gpt_cuda_ops library);
// this header is plain C++. Attention is fused: tiles in shared memory, bf16 tensor-core
// products, the [T, T] scores never in device memory.
// Reductions are deterministic: a row's sums go through a fixed warp/block tree (the
// cross-entropy's one pass merges online-softmax statistics in one), column sums by fixed
// chunks of rows and lanes, the token embedding's gradient by bounded chunks of each token's
// rows, the attention's dk/dv and dq each by one block; no atomics, so two runs give the same bits.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "../attention_math.hpp"
#include "../gpt_math.hpp"
#include "../ops_contract.hpp"
#include "zshard/core/dtype.hpp"

namespace gpt::cuda {

class cuda_ops {
 public:
  using half_t = zshard::bf16;
  float* col_scratch = nullptr;  // set by the model (ops_contract.hpp)
  static constexpr int max_head_dim = math::attention_max_head_dim;  // the attention kernels' limit

  // cublas_workspace: device bytes for cuBLAS (NVIDIA recommends 32 MiB on Hopper). timeout:
  // how long a host wait (a download, teardown) waits for the stream before it gives up; pass
  // the backend's cuda_backend_options::sync_timeout.
  cuda_ops(int device, cudaStream_t stream, std::size_t cublas_workspace = std::size_t{32} << 20,
           std::chrono::milliseconds timeout = std::chrono::minutes(5));
  ~cuda_ops();
  cuda_ops(const cuda_ops&) = delete;
  cuda_ops& operator=(const cuda_ops&) = delete;

  cudaStream_t stream() const noexcept;
  // Device bytes this object holds beside the arenas it hands out (the cuBLAS workspace): part
  // of the plan's workspace term (plan/device_overheads.hpp).
  std::size_t workspace_bytes() const noexcept;

  // ---- memory (stream-ordered from the device's default pool, not the backend's: the model
  // reports its arena to the engine as activations) ----------------------------------------------
  void* allocate(std::size_t bytes);
  void deallocate(void* p) noexcept;  // in the stream's order: never waits
  void zero(void* p, std::size_t bytes);
  // Pinned staging sized once for uploads and downloads of up to these many bytes (the model
  // calls it at construction), so steady-state steps never allocate pinned memory.
  void reserve_staging(std::size_t upload_bytes, std::size_t download_bytes);
  // Through pinned staging, asynchronous: ordered before everything enqueued after it.
  void upload(void* dst, const void* host_src, std::size_t bytes);
  // Waits for the stream up to the copy (polling, bounded by a timeout), then returns.
  void download(void* host_dst, const void* src, std::size_t bytes);

  // ---- matmuls --------------------------------------------------------------------------------
  void gemm(bool ta, bool tb, int m, int n, int k, const half_t* A, int lda, long long sa, const half_t* B, int ldb,
            long long sb, float* C, int ldc, long long sc, int batch, float beta);
  // FLOP/s of a square [n, n] x [n, n] product in this configuration (bf16 in, f32 out, f32
  // accumulation), the best of `reps` after a warm-up: the rate MFU is measured against.
  double gemm_flops_per_s(int n, int reps);

  // ---- the rest (ops_contract.hpp) ------------------------------------------------------------
  void embed_forward(const std::int32_t* tokens, const half_t* wte, const half_t* wpe, float* x, int batch, int seq,
                     int d);
  void embed_backward(const ops::token_chunks& tc, const float* dx, float* dwte, float* dwpe, int batch, int seq, int d);
  void layer_norm_forward(const float* x, const half_t* gain, const half_t* bias, half_t* y, float* mean, float* rstd,
                          int rows, int d);
  void residual_layer_norm_forward(const float* x, const float* branch, const half_t* branch_bias, float* sum,
                                   const half_t* gain, const half_t* bias, half_t* y, float* mean, float* rstd, int rows,
                                   int d);
  void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const half_t* gain,
                           float* dx, int rows, int d);
  void layer_norm_param_grad(const float* dy, const float* x, const float* mean, const float* rstd, float* dgain,
                             float* dbias, int rows, int d);
  void bias_grad(const float* dy, float* dbias, int rows, int cols);
  void bias_gelu_forward(float* pre, const half_t* bias, half_t* act, int rows, int cols);
  void gelu_forward(const float* pre, half_t* act, std::size_t n);
  void gelu_backward(const float* pre, float* d, half_t* d_half, std::size_t n);
  void bias_to_half(const float* x, const half_t* bias, half_t* y, int rows, int cols);
  // Fused causal attention (attention_kernels.cuh; heads of up to max_head_dim elements).
  void attention_forward(const half_t* qkv, half_t* out, float* lse, const math::head_layout& hl, float scale);
  void attention_backward_prepare(const float* d_out, const half_t* out, half_t* d_out_half, float* delta,
                                  const math::head_layout& hl);
  void attention_backward(const half_t* qkv, const half_t* d_out_half, const float* lse, const float* delta,
                          float* dqkv, half_t* dqkv_half, const math::head_layout& hl, float scale);
  void residual_add(const float* x, const float* branch, const half_t* bias, float* out, int rows, int cols);
  void to_half(const float* src, half_t* dst, std::size_t n);
  void cross_entropy(const float* logits, const std::int32_t* targets, float* row_loss, half_t* dlogits,
                     float grad_weight, int rows, int vocab);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace gpt::cuda

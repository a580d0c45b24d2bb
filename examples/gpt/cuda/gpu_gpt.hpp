#pragma once
// Training the backend-generic GPT on GPUs, shared by the example (examples/05_train_gpt_gpu.cu)
// and the bench (bench/gpu/gpt_stage.hpp): through zshard (cuda_backend + nccl_comm, one thread
// and one rank per GPU) or as a plain single-GPU loop (every weight resident, the same AdamW
// kernel), with what a step costs in time and in device memory:
//   ledger peak      the backend's memory ledger (activations included: the model reports its arena)
//   pool reserved    what the stream-ordered pool holds (high-water mark over the step); the
//                    arena comes from the device's default pool, not the backend's, so pool / (ledger -
//                    activations) is the pool's overhead
//   device used      cudaMemGetInfo's used bytes above `baseline_used` (what the device used
//                    before: nvidia-smi before the process, or this process's state before the run)
//   plan             plan::plan_memory over the schedule recorded from the same runner, with
//                    cuda_defaults() for what the GPU holds beyond the ledger.
// For CUDA translation units (cuda_backend.hpp launches kernels).
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "../corpus.hpp"
#include "../ops_plan.hpp"
#include "cuda_ops.hpp"
#include "zshard/backend/cuda_backend.hpp"
#include "zshard/comm/nccl_ranks.hpp"

namespace gpt::cuda {

struct step_stats {
  int step = 0;
  double loss = NAN, eval_loss = NAN;  // mean over ranks
  double grad_norm = 0;
  double seconds = 0;                  // wall time of this step on rank 0 (loss read included)
  std::size_t ledger_peak = 0, ledger_activations = 0;
  std::uint64_t pool_reserved = 0, pool_high = 0;
  std::size_t device_used = 0;  // above the baseline, at the end of the step (the pool does not shrink)
};

inline std::size_t device_used_now(int device) {
  zshard::cuda::ensure_device(device);
  std::size_t free = 0, total = 0;
  ZSHARD_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

inline void pool_stats(cudaMemPool_t pool, std::uint64_t& reserved, std::uint64_t& high) {
  ZSHARD_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  ZSHARD_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high));
}
inline void reset_pool_high(cudaMemPool_t pool) {
  std::uint64_t zero = 0;  // resets the high-water mark to the current reserve
  ZSHARD_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
}

// Trains through zshard on `devices` (one rank each); on_step(stats) runs on rank 0 after every
// step. baseline_used: device 0's used bytes before this run (device_used is measured above it).
template <class OnStep>
void train_with_engine(std::span<const int> devices, const gpu_run_options& o, const corpus& data,
                       const zshard_model& model, const zshard::engine_config& cfg, std::size_t baseline_used,
                       OnStep&& on_step) {
  const int world = int(devices.size()), seq = model.config.seq_len;
  std::vector<std::atomic<double>> losses(devices.size()), evals(devices.size());
  zshard::nccl_options comm_opts;
  comm_opts.completion = zshard::nccl_completion::enqueue;  // collectives never block the host
  zshard::run_nccl_ranks(
      devices,
      [&](zshard::nccl_comm& comm) {
        const int rank = comm.rank();
        zshard::cuda_backend backend({.device = comm.device()});
        const auto stream = backend.make_stream();
        cuda_ops ops(comm.device(), stream.handle(), std::size_t{32} << 20, backend.options().sync_timeout);
        ops_gpt<cuda_ops> net(ops, model.config, o.batch, seq, o.checkpoint);
        using engine_t = zshard::engine<zshard::cuda_backend, zshard::nccl_comm, gpu_policies>;
        engine_t eng(backend, comm, model.spec, cfg);
        ops_engine_runner<engine_t, cuda_ops> runner(eng, model, &net, net.arena_bytes(), o.checkpoint);
        for (int step = 1; step <= o.steps; ++step) {
          backend.ledger().reset_peaks();
          reset_pool_high(backend.pool());
          const auto t0 = std::chrono::steady_clock::now();
          runner.train_micro_batch(data.get_rows(std::uint64_t(step - 1), rank * o.batch, o.batch, seq));
          const auto rep = eng.step();
          step_stats st;
          st.step = step;
          st.grad_norm = rep.grad_norm;
          const bool read = o.read_loss || step == o.steps;
          if (read) losses[std::size_t(rank)] = runner.mean_loss();  // waits for the step
          else backend.synchronize(stream);
          st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (o.eval_every > 0 && step % o.eval_every == 0) {
            runner.evaluate(data.get_rows(1'000'000 + std::uint64_t(step), rank * o.batch, o.batch, seq));
            evals[std::size_t(rank)] = runner.mean_loss();
          }
          comm.barrier();  // every rank's figures are in
          if (rank != 0) continue;
          st.loss = st.eval_loss = 0;
          for (int r = 0; r < world; ++r) {
            st.loss += losses[std::size_t(r)] / world;
            st.eval_loss += evals[std::size_t(r)] / world;
          }
          if (!(o.eval_every > 0 && step % o.eval_every == 0)) st.eval_loss = NAN;
          if (!read) st.loss = NAN;
          st.ledger_peak = backend.ledger().total_peak();
          st.ledger_activations = backend.ledger().current(zshard::mem_category::activations);
          pool_stats(backend.pool(), st.pool_reserved, st.pool_high);
          const std::size_t used = device_used_now(comm.device());
          st.device_used = used > baseline_used ? used - baseline_used : 0;
          on_step(st);
        }
      },
      comm_opts);
}

// The same model as a plain single-GPU loop: weights resident, plain_trainer's optimizer step.
template <class OnStep>
void train_plain(int device, const gpu_run_options& o, const corpus& data, const zshard_model& model,
                 const zshard::engine_config& cfg, std::size_t baseline_used, OnStep&& on_step) {
  zshard::cuda_backend backend({.device = device});
  const auto stream = backend.make_stream();
  cuda_ops ops(device, stream.handle(), std::size_t{32} << 20, backend.options().sync_timeout);
  ops_gpt<cuda_ops> net(ops, model.config, o.batch, model.config.seq_len, o.checkpoint);
  backend.ledger().charge(zshard::mem_category::activations, net.arena_bytes());  // as the engine run reports it
  plain_trainer<zshard::cuda_backend, cuda_ops> trainer(backend, model, o.seed, net, cfg.adamw, cfg.clip_norm, stream);
  for (int step = 1; step <= o.steps; ++step) {
    backend.ledger().reset_peaks();
    reset_pool_high(backend.pool());
    const auto t0 = std::chrono::steady_clock::now();
    step_stats st;
    st.step = step;
    st.grad_norm = trainer.train_step({data.get_rows(std::uint64_t(step - 1), 0, o.batch, model.config.seq_len)});
    if (o.read_loss || step == o.steps) st.loss = net.mean_loss();
    else backend.synchronize(stream);
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.ledger_peak = backend.ledger().total_peak();
    st.ledger_activations = net.arena_bytes();
    pool_stats(backend.pool(), st.pool_reserved, st.pool_high);
    const std::size_t used = device_used_now(device);
    st.device_used = used > baseline_used ? used - baseline_used : 0;
    on_step(st);
  }
  backend.ledger().release(zshard::mem_category::activations, net.arena_bytes());
}

}  // namespace gpt::cuda

#pragma once
// The example GPT on the GPU (examples/gpt/cuda: the project's kernels and cuBLAS bf16
// matmuls, through the engine on cuda_backend + nccl_comm) against the host: 50 steps that
// follow the host backend's run (the Eigen model) within the bf16 tolerance, and the host
// emulation of the GPU's rounding (host_ops<bf16>) within a tight one; the tolerances and their
// derivation are in tests/examples/gpt_equivalence_setup.hpp. Also: kernels deterministic
// (activation checkpointing changes no bit), and the bench's plain loop does the engine's work
// (equal at world 1). Part of test_cuda.cu's single translation unit; the host runs come from
// gpt_host_reference.cpp.
#include <atomic>

#include "../../examples/gpt/cuda/cuda_ops.hpp"
#include "../../examples/gpt/ops_runner.hpp"
#include "gpt_host_reference.hpp"

namespace gpt_cases {

using cuda_ops = gpt::cuda::cuda_ops;

// s on `world` GPUs, each rank s.batch / world rows of every global batch; per step the mean of
// the ranks' losses and the global gradient norm.
inline gpt_equivalence::run gpu_run(const gpt_equivalence::setup& s, int world) {
  REQUIRE(s.batch % world == 0);
  const auto devs = gpu_test::devices(world);
  REQUIRE(int(devs.size()) == world);
  const auto data = s.data();
  const auto model = gpt::make_zshard_model(s.model, s.seed);
  const int rows = s.batch / world, seq = s.model.seq_len;
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(world)), norms(static_cast<std::size_t>(world));
  zshard::nccl_options opts;
  opts.completion = zshard::nccl_completion::enqueue;
  opts.timeout = std::chrono::milliseconds(60'000);
  zshard::run_nccl_ranks(
      devs,
      [&](zshard::nccl_comm& comm) {
        const auto r = std::size_t(comm.rank());
        zshard::cuda_backend backend({.device = comm.device()});
        const auto stream = backend.make_stream();
        cuda_ops ops(comm.device(), stream.handle());
        gpt::ops_gpt<cuda_ops> net(ops, s.model, rows, seq, s.checkpoint);
        using engine_t = zshard::engine<zshard::cuda_backend, zshard::nccl_comm>;
        engine_t eng(backend, comm, model.spec, s.engine());
        gpt::ops_engine_runner<engine_t, cuda_ops> runner(eng, model, &net, net.arena_bytes(), s.checkpoint);
        for (int step = 0; step < s.steps; ++step) {
          runner.train_micro_batch(data.get_rows(std::uint64_t(step), comm.rank() * rows, rows, seq));
          losses[r].push_back(runner.mean_loss());
          norms[r].push_back(eng.step().grad_norm);
        }
        backend.synchronize_all();
      },
      opts);
  gpt_equivalence::run out;
  for (int step = 0; step < s.steps; ++step) {
    double l = 0;
    for (int r = 0; r < world; ++r) l += losses[std::size_t(r)][std::size_t(step)];
    out.losses.push_back(l / world);
    out.grad_norms.push_back(norms[0][std::size_t(step)]);
  }
  return out;
}

inline double first_gap(const gpt_equivalence::run& a, const gpt_equivalence::run& b) {
  return std::abs(a.losses[0] - b.losses[0]) / b.losses[0];
}

}  // namespace gpt_cases

TEST_CASE("GPT on the GPU: 50 steps follow the host backend's run within bf16 tolerance, and the emulation tightly") {
  gpt_equivalence::setup s;
  const auto emulation = gpt_reference::emulation_run(s);
  std::vector<int> worlds = {1};
  if (gpu_test::device_count() >= 2) worlds.push_back(2);
  for (int world : worlds) {
    INFO("world " << world);
    const auto gpu = gpt_cases::gpu_run(s, world);
    REQUIRE(gpu.losses.size() == std::size_t(s.steps));
    const double tight = gpt_equivalence::max_relative_gap(gpu.losses, emulation.losses);
    MESSAGE("world " << world << ": GPU vs host emulation: step 1 relative gap " << gpt_cases::first_gap(gpu, emulation)
            << ", 50 steps " << tight << "; grad norm step 1 "
            << std::abs(gpu.grad_norms[0] - emulation.grad_norms[0]) / emulation.grad_norms[0] << "; loss "
            << gpu.losses.front() << " -> " << gpu.losses.back());
    CHECK(gpt_cases::first_gap(gpu, emulation) < gpt_equivalence::same_rounding_first_step);
    CHECK(std::abs(gpu.grad_norms[0] - emulation.grad_norms[0]) < 1e-3 * emulation.grad_norms[0]);
    CHECK(tight < gpt_equivalence::same_rounding_trajectory);
    CHECK(gpu.losses.back() < 0.7 * gpu.losses.front());
    if (!gpt_reference::has_eigen()) {
      MESSAGE("built without Eigen: the comparison with the host backend's Eigen run is not made here (the CPU "
              "tests make it against the emulation)");
      continue;
    }
    const auto host = gpt_reference::eigen_run(s);
    const double gap = gpt_equivalence::max_relative_gap(gpu.losses, host.losses);
    MESSAGE("world " << world << ": GPU vs host backend (Eigen, bf16 weights, f32 math): step 1 relative gap "
            << gpt_cases::first_gap(gpu, host) << " (bound " << gpt_equivalence::first_step_tolerance(s)
            << "), 50 steps " << gap << " (bound " << gpt_equivalence::trajectory_tolerance << ")");
    CHECK(gpt_cases::first_gap(gpu, host) < gpt_equivalence::first_step_tolerance(s));
    CHECK(gap < gpt_equivalence::trajectory_tolerance);
  }
}

TEST_CASE("GPT on the GPU: deterministic kernels (checkpointing changes no bit), and the plain loop is the engine's work") {
  gpt_equivalence::setup s;
  s.steps = 4;
  s.checkpoint = true;
  const auto with_ckpt = gpt_cases::gpu_run(s, 1);
  s.checkpoint = false;
  const auto without = gpt_cases::gpu_run(s, 1);
  CHECK(with_ckpt.losses == without.losses);
  CHECK(with_ckpt.grad_norms == without.grad_norms);

  // plain_trainer: weights resident, the same AdamW and sum-of-squares kernels, no collectives
  zshard::cuda_backend backend;
  const auto stream = backend.make_stream();
  gpt_cases::cuda_ops ops(0, stream.handle());
  gpt::ops_gpt<gpt_cases::cuda_ops> net(ops, s.model, s.batch, s.model.seq_len, false);
  const auto model = gpt::make_zshard_model(s.model, s.seed);
  gpt::plain_trainer<zshard::cuda_backend, gpt_cases::cuda_ops> plain(backend, model, s.seed, net, s.engine().adamw,
                                                                       s.clip, stream);
  const auto data = s.data();
  std::vector<double> losses;
  for (int step = 0; step < s.steps; ++step) {
    plain.train_step({s.batch_of(data, step)});
    losses.push_back(net.mean_loss());
  }
  for (int step = 0; step < s.steps; ++step)  // NCCL at one rank copies; the rest is the same kernels
    CHECK(std::abs(losses[std::size_t(step)] - without.losses[std::size_t(step)]) <= 1e-6 * without.losses[std::size_t(step)]);
  MESSAGE("plain loop vs engine at world 1: " << (losses == without.losses ? "bit for bit" : "within 1e-6"));
}

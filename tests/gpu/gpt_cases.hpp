#pragma once
// The example GPT on the GPU (examples/gpt/cuda: the project's kernels and cuBLAS bf16
// matmuls, through the engine on cuda_backend + nccl_comm) against the host: 50 steps that
// follow the host backend's run (the Eigen model) within the bf16 tolerance, and the host
// emulation of the GPU's rounding (host_ops<bf16>) within a tight one; the tolerances and their
// derivation are in tests/examples/gpt_equivalence_setup.hpp. Also: kernels deterministic
// (activation checkpointing changes no bit), and the bench's plain loop does the engine's work
// (equal at world 1); and the fused attention's kernels alone against host_ops<bf16> (the same
// math, attention_math.hpp) at sequences and heads off the kernels' 64-key tile. Part of
// test_cuda.cu's single translation unit; the host runs come from gpt_host_reference.cpp.
#include <atomic>
#include <cmath>
#include <initializer_list>

#include "../../examples/gpt/cuda/cuda_ops.hpp"
#include "../../examples/gpt/host_ops.hpp"
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

// What one attention forward + backward produced, on the host.
struct attention_out {
  std::vector<zshard::bf16> out, dqkv_half;
  std::vector<float> lse, dqkv;
};

// max |a - b| / max |b| over two tensors of the same size.
template <class T>
double rel_gap(const std::vector<T>& a, const std::vector<T>& b) {
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(gpt::math::load(a[i])) - double(gpt::math::load(b[i]))));
    scale = std::max(scale, std::abs(double(gpt::math::load(b[i]))));
  }
  return err / scale;
}

// Forward and backward of the fused attention on qkv [B T, 3d] (bf16) and d_out [B T, d], on
// the GPU (device 0) or on the host (host_ops<bf16>).
inline attention_out attention_on_gpu(const gpt::math::head_layout& hl, const std::vector<zshard::bf16>& qkv,
                                      const std::vector<float>& d_out, float scale) {
  zshard::cuda_backend backend;
  const auto stream = backend.make_stream();
  cuda_ops ops(0, stream.handle());
  const std::size_t n = std::size_t(hl.batch) * hl.seq, d = std::size_t(hl.d_model()), rows = n * hl.heads;
  auto* q = static_cast<zshard::bf16*>(ops.allocate(qkv.size() * 2));
  auto* out = static_cast<zshard::bf16*>(ops.allocate(n * d * 2));
  auto* d_out_half = static_cast<zshard::bf16*>(ops.allocate(n * d * 2));
  auto* dqkv_half = static_cast<zshard::bf16*>(ops.allocate(qkv.size() * 2));
  auto* g = static_cast<float*>(ops.allocate(n * d * 4));
  auto* lse = static_cast<float*>(ops.allocate(rows * 4));
  auto* delta = static_cast<float*>(ops.allocate(rows * 4));
  auto* dqkv = static_cast<float*>(ops.allocate(qkv.size() * 4));
  ops.upload(q, qkv.data(), qkv.size() * 2);
  ops.upload(g, d_out.data(), d_out.size() * 4);
  ops.attention_forward(q, out, lse, hl, scale);
  ops.attention_backward_prepare(g, out, d_out_half, delta, hl);
  ops.attention_backward(q, d_out_half, lse, delta, dqkv, dqkv_half, hl, scale);
  attention_out r{std::vector<zshard::bf16>(n * d), std::vector<zshard::bf16>(qkv.size()), std::vector<float>(rows),
                  std::vector<float>(qkv.size())};
  ops.download(r.out.data(), out, r.out.size() * 2);
  ops.download(r.lse.data(), lse, r.lse.size() * 4);
  ops.download(r.dqkv.data(), dqkv, r.dqkv.size() * 4);
  ops.download(r.dqkv_half.data(), dqkv_half, r.dqkv_half.size() * 2);
  for (void* p : std::initializer_list<void*>{q, out, d_out_half, dqkv_half, g, lse, delta, dqkv}) ops.deallocate(p);
  return r;
}
inline attention_out attention_on_host(const gpt::math::head_layout& hl, const std::vector<zshard::bf16>& qkv,
                                       const std::vector<float>& d_out, float scale) {
  gpt::host_ops<zshard::bf16> ops;
  const std::size_t n = std::size_t(hl.batch) * hl.seq, d = std::size_t(hl.d_model()), rows = n * hl.heads;
  attention_out r{std::vector<zshard::bf16>(n * d), std::vector<zshard::bf16>(qkv.size()), std::vector<float>(rows),
                  std::vector<float>(qkv.size())};
  std::vector<zshard::bf16> d_out_half(n * d);
  std::vector<float> delta(rows);
  ops.attention_forward(qkv.data(), r.out.data(), r.lse.data(), hl, scale);
  ops.attention_backward_prepare(d_out.data(), r.out.data(), d_out_half.data(), delta.data(), hl);
  ops.attention_backward(qkv.data(), d_out_half.data(), r.lse.data(), delta.data(), r.dqkv.data(), r.dqkv_half.data(),
                         hl, scale);
  return r;
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

TEST_CASE("GPT on the GPU: fused attention forward and backward against host_ops<bf16>, sizes off the 64-key tile") {
  struct shape {
    int B, T, heads, hd;
  };
  // One tile and less, several with a partial last one, heads padded to 16 (5, 8, 24, 72) or
  // not (64, 128), the vectorised tile loads (hd a multiple of 8) and the scalar ones.
  for (const shape s : {shape{1, 1, 1, 5}, shape{2, 16, 4, 8}, shape{1, 65, 2, 24}, shape{2, 130, 3, 72},
                        shape{1, 200, 2, 64}, shape{1, 129, 1, 128}}) {
    INFO("B " << s.B << " T " << s.T << " heads " << s.heads << " head_dim " << s.hd);
    const gpt::math::head_layout hl{s.B, s.T, s.heads, s.hd};
    const std::size_t n = std::size_t(s.B) * s.T, d = std::size_t(hl.d_model());
    std::mt19937 rng(51);
    std::normal_distribution<float> dist(0.0f, 1.5f);
    std::vector<zshard::bf16> qkv(n * 3 * d);
    for (auto& x : qkv) x = zshard::to_bf16(dist(rng));
    std::vector<float> d_out(n * d);
    for (auto& x : d_out) x = dist(rng);
    const float scale = 1.0f / std::sqrt(float(s.hd));
    const auto gpu = gpt_cases::attention_on_gpu(hl, qkv, d_out, scale);
    const auto host = gpt_cases::attention_on_host(hl, qkv, d_out, scale);
    // Same rounding points; the device's f32 sums run in another order and its expf differs by
    // an ulp or two, which moves a bf16 rounding of p, ds or the output now and then.
    const double out = gpt_cases::rel_gap(gpu.out, host.out), lse = gpt_cases::rel_gap(gpu.lse, host.lse),
                 dqkv = gpt_cases::rel_gap(gpu.dqkv, host.dqkv);
    MESSAGE("T " << s.T << " hd " << s.hd << ": GPU vs host emulation: out " << out << ", lse " << lse << ", dqkv " << dqkv);
    CHECK(out < 1.0 / 128);
    CHECK(lse < 1e-5);
    CHECK(dqkv < 1.0 / 128);
    for (std::size_t i = 0; i < gpu.dqkv.size(); ++i)
      REQUIRE(gpu.dqkv_half[i].bits == zshard::to_bf16(gpu.dqkv[i]).bits);
    const auto again = gpt_cases::attention_on_gpu(hl, qkv, d_out, scale);  // deterministic: no atomics
    CHECK(again.dqkv == gpu.dqkv);
    CHECK(again.lse == gpu.lse);
  }
}

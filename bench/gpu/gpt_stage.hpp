#pragma once
// bench_gpu's stage 5: the example GPT on one GPU at GPT-2-small shape (12 x 768, vocab 50304,
// sequence 1024, batch 8), the same kernels (examples/gpt/cuda) as a plain training loop
// (every weight resident, the same AdamW kernel, examples/gpt/ops_runner.hpp's plain_trainer)
// and through zshard (cuda_backend + nccl_comm, one rank), with and without activation
// checkpointing, side by side in one run. Per configuration: ms per step and tokens/s over the
// steady-state steps (the first two record the prefetch trace and fill the pool), MFU (model
// FLOPs/s over the rate of an 8192^3 cuBLAS bf16 GEMM timed first), and device memory: the
// device's used bytes above what it used before the configuration started, over the plan's
// device total less its CUDA-context term (the context exists before the first configuration),
// and for zshard the pool's high-water mark over the ledger's peak without activations (the
// model's arena is plain cudaMalloc, outside the pool). Part of bench_gpu.cu's translation unit.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "../../examples/gpt/cuda/gpu_gpt.hpp"

namespace gpt_stage {

struct row {
  std::string name;
  bool engine = false, checkpoint = false;
  double ms = 0, tokens_per_s = 0, mfu = 0, used_vs_plan = 0, pool_vs_ledger = 0;
  double ledger_gib = 0, pool_gib = 0, used_gib = 0, plan_gib = 0;
  double loss_first = 0, loss_last = 0;
};

struct result {
  std::vector<row> rows;
  double gemm_tflops = 0;
  const row& find(bool engine, bool checkpoint) const {
    for (const auto& r : rows)
      if (r.engine == engine && r.checkpoint == checkpoint) return r;
    return rows.front();
  }
};

inline result run(bool quick) {
  constexpr double gib = double(1ull << 30);
  gpt::gpu_run_options o;
  o.model = {.vocab = 50304, .seq_len = 1024, .d_model = 768, .n_heads = 12, .n_layers = 12, .d_ff = 3072};
  o.batch = 8;
  o.steps = quick ? 6 : 12;
  o.lr = 6e-4f;
  o.read_loss = false;  // no host wait per step beyond the engine's own
  const int warm = 2;
  const auto data = gpt::corpus::synthetic(o.seed, o.model.vocab, std::size_t{1} << 18);
  const auto model = gpt::make_zshard_model(o.model, o.seed);
  const double flops_token = gpt::flops_per_token(o.model, o.model.seq_len);
  result res;
  {
    zshard::cuda_backend b;
    gpt::cuda::cuda_ops probe(0, b.make_stream().handle());
    res.gemm_tflops = probe.gemm_flops_per_s(8192, quick ? 3 : 5) / 1e12;
  }
  for (bool checkpoint : {false, true})
    for (bool engine : {false, true}) {
      o.checkpoint = checkpoint;
      const auto cfg = gpt::engine_config_for(o);
      const auto plan = gpt::plan_for<gpt::cuda::cuda_ops>(model, cfg, 1, o);
      const double plan_total = double(plan.device_total() - plan.overheads.cuda_context_bytes);
      ZSHARD_CUDA_CHECK(cudaDeviceSynchronize());
      const std::size_t before = gpt::cuda::device_used_now(0);
      row r;
      r.name = std::string(engine ? "zshard engine" : "plain loop") + (checkpoint ? ", checkpointing" : "");
      r.engine = engine;
      r.checkpoint = checkpoint;
      r.plan_gib = plan_total / gib;
      double seconds = 0;
      int timed = 0;
      const auto on_step = [&](const gpt::cuda::step_stats& st) {
        if (st.step > warm) {
          seconds += st.seconds;
          ++timed;
        }
        r.ledger_gib = std::max(r.ledger_gib, double(st.ledger_peak) / gib);
        r.pool_gib = std::max(r.pool_gib, double(st.pool_high) / gib);
        r.used_gib = std::max(r.used_gib, double(st.device_used) / gib);
        if (engine)
          r.pool_vs_ledger = std::max(r.pool_vs_ledger,
                                      double(st.pool_high) / double(st.ledger_peak - st.ledger_activations));
        if (st.step == o.steps) r.loss_last = st.loss;
      };
      if (engine) {
        const int dev[1] = {0};
        gpt::cuda::train_with_engine(dev, o, data, model, cfg, before, on_step);
      } else {
        gpt::cuda::train_plain(0, o, data, model, cfg, before, on_step);
      }
      r.ms = 1e3 * seconds / timed;
      r.tokens_per_s = double(o.batch) * o.model.seq_len * timed / seconds;
      r.mfu = r.tokens_per_s * flops_token / (res.gemm_tflops * 1e12);
      r.used_vs_plan = r.used_gib / r.plan_gib;
      res.rows.push_back(r);
    }
  std::printf("\n5. the example GPT on one GPU, GPT-2 small (124M + 38.6M head, vocab 50304, seq 1024, batch 8), bf16 "
              "matmuls on cuBLAS (8192^3 GEMM: %.0f TFLOP/s), %d steps (first %d not timed)\n",
              res.gemm_tflops, o.steps, warm);
  std::printf("%-34s %8s %10s %6s %10s %10s %10s %10s %8s %8s %9s\n", "configuration", "ms/step", "tok/s", "MFU",
              "ledger GiB", "pool GiB", "used GiB", "plan GiB", "used/plan", "pool/led", "loss end");
  for (const auto& r : res.rows)
    std::printf("%-34s %8.2f %10.0f %6.3f %10.2f %10.2f %10.2f %10.2f %8.3f %8.3f %9.4f\n", r.name.c_str(), r.ms,
                r.tokens_per_s, r.mfu, r.ledger_gib, r.pool_gib, r.used_gib, r.plan_gib, r.used_vs_plan,
                r.pool_vs_ledger, r.loss_last);
  return res;
}

// The key figures, `name: value`, for bench_gpu's closing lines.
inline void print_figures(const result& res) {
  const row& eng = res.find(true, false);
  const row& eng_ck = res.find(true, true);
  const row& plain = res.find(false, false);
  const row& plain_ck = res.find(false, true);
  constexpr double pytorch_eager_tokens_per_s = 309'000;  // issue 24: PyTorch 2.11 eager, same H200, same shape
  std::printf("gpu_gpt_tokens_per_s: %.0f\ngpu_gpt_tokens_per_s_checkpointing: %.0f\n"
              "gpu_gpt_plain_tokens_per_s: %.0f\ngpu_gpt_plain_tokens_per_s_checkpointing: %.0f\n"
              "gpu_gpt_engine_vs_plain: %.3f\ngpu_gpt_engine_vs_plain_checkpointing: %.3f\ngpu_gpt_mfu: %.3f\n"
              "gpu_gpt_vs_pytorch_eager: %.3f\ngpu_gemm_tflops: %.0f\ndevice_used_vs_plan: %.3f\n"
              "gpt_engine_pool_vs_ledger: %.3f\n",
              eng.tokens_per_s, eng_ck.tokens_per_s, plain.tokens_per_s, plain_ck.tokens_per_s,
              eng.tokens_per_s / plain.tokens_per_s, eng_ck.tokens_per_s / plain_ck.tokens_per_s, eng.mfu,
              eng.tokens_per_s / pytorch_eager_tokens_per_s, res.gemm_tflops,
              std::max({eng.used_vs_plan, eng_ck.used_vs_plan, plain.used_vs_plan, plain_ck.used_vs_plan}),
              std::max(eng.pool_vs_ledger, eng_ck.pool_vs_ledger));
}

}  // namespace gpt_stage

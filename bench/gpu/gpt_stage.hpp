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
// model's arena is in the device's default pool, outside the backend's). Part of bench_gpu.cu's
// translation unit.
//
// PyTorch beside it: run.sh times bench/gpu/torch_reference.py (the same GPT, shape and batch;
// bf16 autocast, SDPA, fused AdamW; eager, and torch.compile when it compiles in its budget) on
// the same GPU in the same call and hands its output here (--torch-ref FILE). The ratios
// gpu_gpt_vs_pytorch_eager and gpu_gpt_vs_torch_compile are printed only from such a file, and
// only when it names this GPU and this shape: never against a figure from another machine.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
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

// What torch_reference.py printed (`name: value` lines), from the files run.sh wrote this run.
struct torch_reference {
  std::map<std::string, std::string> values;
  std::vector<std::string> files;

  static torch_reference read(const std::vector<std::string>& paths) {
    torch_reference t;
    for (const auto& path : paths) {
      std::ifstream in(path);
      if (!in) throw std::runtime_error("bench_gpu: cannot read the PyTorch reference " + path);
      t.files.push_back(path);
      for (std::string line; std::getline(in, line);) {
        const auto colon = line.find(": ");
        if (colon == std::string::npos || !line.starts_with("torch_")) continue;
        const std::string key = line.substr(0, colon), value = line.substr(colon + 2);
        const auto same = t.values.find(key);
        if (same != t.values.end() && same->second != value && (key == "torch_device" || key == "torch_shape"))
          throw std::runtime_error("bench_gpu: the PyTorch reference files disagree on " + key + ": '" +
                                   same->second + "' vs '" + value + "'");
        t.values[key] = value;
      }
    }
    return t;
  }
  std::string get(const std::string& key) const {
    const auto it = values.find(key);
    return it == values.end() ? std::string() : it->second;
  }
  double number(const std::string& key) const {
    const std::string v = get(key);
    return v.empty() ? 0.0 : std::stod(v);
  }
};

// The shape line torch_reference.py prints for the run it timed.
inline std::string torch_shape(const gpt::gpt_config& c, int batch) {
  return "vocab " + std::to_string(c.vocab) + " seq " + std::to_string(c.seq_len) + " d_model " +
         std::to_string(c.d_model) + " heads " + std::to_string(c.n_heads) + " layers " + std::to_string(c.n_layers) +
         " d_ff " + std::to_string(c.d_ff) + " batch " + std::to_string(batch);
}

struct result {
  std::vector<row> rows;
  double gemm_tflops = 0;
  double flops_per_token = 0;
  std::string shape;  // as torch_shape()
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
  res.flops_per_token = flops_token;
  res.shape = torch_shape(o.model, o.batch);
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

// PyTorch's rows beside ours, and whether a ratio may be taken: only when the reference ran
// here (this device, this shape). Returns the reason when it may not (empty when it may).
inline std::string print_reference(const result& res, const torch_reference& ref, const std::string& device) {
  if (ref.files.empty()) return "no PyTorch reference was run with this bench (run.sh runs one where torch imports)";
  const std::string dev = ref.get("torch_device"), shape = ref.get("torch_shape");
  std::printf("\nPyTorch %s on %s (bench/gpu/torch_reference.py, this run; %s)\n", ref.get("torch_version").c_str(),
              dev.c_str(), shape.c_str());
  std::printf("%-34s %8s %10s %6s %10s\n", "configuration", "ms/step", "tok/s", "MFU", "peak GiB");
  for (const char* mode : {"eager", "compile"}) {
    const double tps = ref.number(std::string("torch_") + mode + "_tokens_per_s");
    if (tps <= 0) continue;
    std::printf("%-34s %8.2f %10.0f %6.3f %10.2f\n",
                mode == std::string("eager") ? "PyTorch eager, bf16 autocast" : "PyTorch torch.compile, bf16 autocast",
                ref.number(std::string("torch_") + mode + "_ms_per_step"), tps,
                tps * res.flops_per_token / (res.gemm_tflops * 1e12), ref.number(std::string("torch_") + mode + "_peak_gib"));
  }
  if (dev != device) return "the reference ran on '" + dev + "', this bench on '" + device + "'";
  if (shape != res.shape) return "the reference's shape '" + shape + "' is not the bench's '" + res.shape + "'";
  return {};
}

// The key figures, `name: value`, for bench_gpu's closing lines; the PyTorch ratios only from a
// reference taken on `device` in this run (print_reference).
inline void print_figures(const result& res, const torch_reference& ref, const std::string& device) {
  const row& eng = res.find(true, false);
  const row& eng_ck = res.find(true, true);
  const row& plain = res.find(false, false);
  const row& plain_ck = res.find(false, true);
  const std::string no_ratio = print_reference(res, ref, device);
  std::printf("\n");
  std::printf("gpu_gpt_tokens_per_s: %.0f\ngpu_gpt_tokens_per_s_checkpointing: %.0f\n"
              "gpu_gpt_plain_tokens_per_s: %.0f\ngpu_gpt_plain_tokens_per_s_checkpointing: %.0f\n"
              "gpu_gpt_engine_vs_plain: %.3f\ngpu_gpt_engine_vs_plain_checkpointing: %.3f\ngpu_gpt_mfu: %.3f\n"
              "gpu_gemm_tflops: %.0f\ndevice_used_vs_plan: %.3f\ngpt_engine_pool_vs_ledger: %.3f\n",
              eng.tokens_per_s, eng_ck.tokens_per_s, plain.tokens_per_s, plain_ck.tokens_per_s,
              eng.tokens_per_s / plain.tokens_per_s, eng_ck.tokens_per_s / plain_ck.tokens_per_s, eng.mfu,
              res.gemm_tflops,
              std::max({eng.used_vs_plan, eng_ck.used_vs_plan, plain.used_vs_plan, plain_ck.used_vs_plan}),
              std::max(eng.pool_vs_ledger, eng_ck.pool_vs_ledger));
  if (!no_ratio.empty()) {
    std::printf("# no gpu_gpt_vs_pytorch_eager: %s\n", no_ratio.c_str());
    return;
  }
  const std::string where = device + ", torch " + ref.get("torch_version") + ", same run";
  const double eager = ref.number("torch_eager_tokens_per_s"), compiled = ref.number("torch_compile_tokens_per_s");
  if (eager > 0)
    std::printf("torch_eager_tokens_per_s: %.0f  # %s\ngpu_gpt_vs_pytorch_eager: %.3f  # %s\n", eager, where.c_str(),
                eng.tokens_per_s / eager, where.c_str());
  else
    std::printf("# no gpu_gpt_vs_pytorch_eager: the reference has no eager timing\n");
  if (compiled > 0)
    std::printf("torch_compile_tokens_per_s: %.0f  # %s\ngpu_gpt_vs_torch_compile: %.3f  # %s\n", compiled,
                where.c_str(), eng.tokens_per_s / compiled, where.c_str());
  else
    std::printf("# no gpu_gpt_vs_torch_compile: torch.compile did not compile and run within its budget\n");
}

}  // namespace gpt_stage

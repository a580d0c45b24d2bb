// 05_train_gpt_gpu: the main job's GPT on GPUs. zshard shards it across every GPU of this
// process (cuda_backend + nccl_comm, one thread and one rank per GPU); its matmuls run in bf16
// on cuBLAS with f32 accumulation, everything else in the project's own kernels
// (examples/gpt/cuda/cuda_ops.cu), with activation checkpointing per block and a no-grad
// evaluation pass as on the host (02_train_gpt). The model is written once for both
// (examples/gpt/ops_model.hpp); the CPU tests run it on the host, the GPU tests compare the two.
//
// Per step: loss, tokens/s, MFU (model FLOPs per second over the rate of a large cuBLAS bf16
// GEMM measured at the start of this run), and device memory: the ledger's peak, the pool's
// reserve, the device's used bytes (cudaMemGetInfo, above what it used before this process:
// --baseline-used-mib from nvidia-smi, else this process's own start) beside the plan's device
// total (plan/memory_plan.hpp with plan::device_overheads::cuda_defaults()).
//
//   05_train_gpt_gpu                          a small model, a few hundred steps
//   05_train_gpt_gpu --gpt2-small --steps 30  12 x 768, vocab 50304, seq 1024, batch 8 per GPU
//   05_train_gpt_gpu --plain                  the same model without zshard (one GPU, weights resident)
// Without a GPU it says so and exits with 77 (the GPU tests' "skipped"). --help lists the options.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "gpt/cuda/gpu_gpt.hpp"

namespace {

struct options {
  gpt::gpu_run_options run{
      .model = {.vocab = 64, .seq_len = 64, .d_model = 128, .n_heads = 4, .n_layers = 4, .d_ff = 512},
      .batch = 8, .steps = 200, .checkpoint = true, .lr = 3e-3f, .clip = 1.0, .seed = 1234, .eval_every = 25};
  int gpus = 0;  // 0: every visible GPU
  int log_every = 10;
  bool plain = false;
  double baseline_used_mib = -1;
  bool help = false;
};

void usage() {
  std::printf(
      "usage: 05_train_gpt_gpu [options]\n"
      "  --gpt2-small       GPT-2 small: 12 layers, d_model 768, 12 heads, d_ff 3072, vocab 50304,\n"
      "                     seq 1024, batch 8, lr 6e-4, eval every 10 (change any after it)\n"
      "  --steps N          optimizer steps (default 200)\n"
      "  --batch N          sequences per GPU per step (default 8)\n"
      "  --seq N            sequence length (default 64)\n"
      "  --layers N         transformer blocks (default 4)\n"
      "  --d-model N        model width (default 128)\n"
      "  --heads N          attention heads (default 4)\n"
      "  --d-ff N           MLP width (default 512)\n"
      "  --vocab N          vocabulary of the synthetic language, >= 32 (default 64)\n"
      "  --lr X             AdamW learning rate (default 3e-3)\n"
      "  --clip X           global-norm clipping, 0 = off (default 1.0)\n"
      "  --no-checkpoint    keep every block's activations (default: recompute each block)\n"
      "  --eval-every N     a no-grad evaluation pass every N steps, 0 = never (default 25)\n"
      "  --log-every N      print a step line every N steps (default 10)\n"
      "  --seed N           initialisation and data seed (default 1234)\n"
      "  --gpus N           GPUs to use (default: all visible)\n"
      "  --plain            without zshard: one GPU, every weight resident, the same kernels\n"
      "  --baseline-used-mib X  device 0's used MiB before this process (nvidia-smi), so that\n"
      "                     'used' counts this process's CUDA context too\n"
      "Last lines: final_loss, tokens_per_s, mfu, device_used_vs_plan, engine_pool_vs_ledger.\n");
}

options parse(int argc, char** argv) {
  options o;
  auto& m = o.run.model;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value after ") + argv[i]);
    return argv[++i];
  };
  auto positive = [](const std::string& flag, const std::string& v) {
    const int n = std::stoi(v);
    if (n < 1) throw std::invalid_argument(flag + " must be at least 1, got " + v);
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") o.help = true;
    else if (a == "--gpt2-small") {
      m = {.vocab = 50304, .seq_len = 1024, .d_model = 768, .n_heads = 12, .n_layers = 12, .d_ff = 3072};
      o.run.batch = 8, o.run.lr = 6e-4f, o.run.eval_every = 10;
    }
    else if (a == "--steps") o.run.steps = positive(a, value(i));
    else if (a == "--batch") o.run.batch = positive(a, value(i));
    else if (a == "--seq") m.seq_len = positive(a, value(i));
    else if (a == "--layers") m.n_layers = positive(a, value(i));
    else if (a == "--d-model") m.d_model = positive(a, value(i));
    else if (a == "--heads") m.n_heads = positive(a, value(i));
    else if (a == "--d-ff") m.d_ff = positive(a, value(i));
    else if (a == "--vocab") m.vocab = positive(a, value(i));
    else if (a == "--lr") o.run.lr = std::stof(value(i));
    else if (a == "--clip") o.run.clip = std::stod(value(i));
    else if (a == "--no-checkpoint") o.run.checkpoint = false;
    else if (a == "--eval-every") o.run.eval_every = std::stoi(value(i));
    else if (a == "--log-every") o.log_every = positive(a, value(i));
    else if (a == "--seed") o.run.seed = std::stoull(value(i));
    else if (a == "--gpus") o.gpus = positive(a, value(i));
    else if (a == "--plain") o.plain = true;
    else if (a == "--baseline-used-mib") o.baseline_used_mib = std::stod(value(i));
    else throw std::invalid_argument("unknown option '" + a + "' (try --help)");
  }
  m.validate();
  if (m.vocab < gpt::synthetic_language::min_vocab)
    throw std::invalid_argument("--vocab must be at least " + std::to_string(gpt::synthetic_language::min_vocab) +
                                " for the synthetic language");
  if (o.run.eval_every < 0) throw std::invalid_argument("--eval-every must be >= 0");
  return o;
}

double mib(double bytes) { return bytes / double(1 << 20); }

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  if (o.help) {
    usage();
    return 0;
  }
  const auto census = zshard::cuda::count_devices();
  if (census.count == 0) {
    std::printf("05_train_gpt_gpu: skipped: no CUDA device (%s); this example needs a GPU\n", census.reason.c_str());
    return 77;  // as the GPU tests: run.sh fails on it when nvidia-smi sees a GPU
  }
  const int world = o.plain ? 1 : (o.gpus > 0 ? std::min(o.gpus, census.count) : census.count);
  std::vector<int> devices;
  for (int d = 0; d < world; ++d) devices.push_back(d);
  const auto& mc = o.run.model;

  // Before this process allocates anything on device 0 (its context exists from here on).
  const std::size_t own_start = gpt::cuda::device_used_now(0);
  const std::size_t baseline = o.baseline_used_mib >= 0 ? std::size_t(o.baseline_used_mib * (1 << 20)) : own_start;
  const auto data = gpt::corpus::synthetic(o.run.seed, mc.vocab, std::max<std::size_t>(std::size_t{1} << 18,
                                                                                      std::size_t(4 * mc.seq_len)));
  const auto model = gpt::make_zshard_model(mc, o.run.seed);
  const auto cfg = gpt::engine_config_for(o.run);
  const auto plan = gpt::plan_for<gpt::cuda::cuda_ops>(model, cfg, world, o.run);
  const double plan_total = double(plan.device_total());

  cudaDeviceProp prop{};
  ZSHARD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  double gemm_rate = 0;
  {
    zshard::cuda_backend probe_backend;  // a stream to time the reference GEMM on
    const auto s = probe_backend.make_stream();
    gpt::cuda::cuda_ops probe(0, s.handle());
    gemm_rate = probe.gemm_flops_per_s(8192, 5);
  }
  const double flops_token = gpt::flops_per_token(mc, mc.seq_len);
  std::printf("05_train_gpt_gpu: %s on %d x %s (sm_%d%d); %zu parameters; layers %d, d_model %d, heads %d, d_ff %d, "
              "vocab %d, seq %d, batch %d per GPU; %s; bf16 matmuls on cuBLAS (reference GEMM 8192^3: %.0f TFLOP/s)\n",
              o.plain ? "plain loop (no zshard)" : "zshard", world, prop.name, prop.major, prop.minor,
              model.spec.total_numel(), mc.n_layers, mc.d_model, mc.n_heads, mc.d_ff, mc.vocab, mc.seq_len, o.run.batch,
              o.run.checkpoint ? "activation checkpointing" : "no checkpointing", gemm_rate / 1e12);
  std::printf("plan (per GPU): ledger peak %.1f MiB (activations %.1f MiB) + beyond the ledger %.1f MiB = device %.1f MiB%s\n",
              mib(double(plan.device.total_peak)), mib(double(plan.device.peak_of(zshard::mem_category::activations))),
              mib(double(plan.overheads.total(plan.device.total_peak))), mib(plan_total),
              o.baseline_used_mib >= 0 ? "" : " (used is measured from this process's start: its CUDA context is not counted)");
  std::fflush(stdout);

  double first_loss = NAN, last_loss = NAN, seconds = 0, worst_used = 0, worst_pool = 0;
  int timed_steps = 0;
  double interval_s = 0;
  int interval_steps = 0;
  const auto on_step = [&](const gpt::cuda::step_stats& st) {
    if (std::isnan(first_loss)) first_loss = st.loss;
    last_loss = st.loss;
    interval_s += st.seconds;
    ++interval_steps;
    if (st.step > 2) {  // steady state: the first steps record the prefetch trace and fill the pool
      seconds += st.seconds;
      ++timed_steps;
    }
    worst_used = std::max(worst_used, double(st.device_used) / plan_total);
    if (!o.plain) worst_pool = std::max(worst_pool, double(st.pool_high) / double(st.ledger_peak - st.ledger_activations));
    if (st.step % o.log_every == 0 || st.step == 1 || st.step == o.run.steps) {
      const double tps = double(world) * o.run.batch * mc.seq_len * interval_steps / interval_s;
      std::printf("step %4d  loss %.4f  %8.0f tok/s  MFU %.3f  grad-norm %.3f | MiB: ledger peak %.0f, pool %.0f (high %.0f), "
                  "used %.0f / plan %.0f (%.2f)\n",
                  st.step, st.loss, tps, tps * flops_token / (world * gemm_rate), st.grad_norm, mib(double(st.ledger_peak)),
                  mib(double(st.pool_reserved)), mib(double(st.pool_high)), mib(double(st.device_used)), mib(plan_total),
                  double(st.device_used) / plan_total);
      interval_s = 0;
      interval_steps = 0;
    }
    if (!std::isnan(st.eval_loss)) std::printf("  eval (no-grad pass) loss %.4f\n", st.eval_loss);
    std::fflush(stdout);
  };
  if (o.plain)
    gpt::cuda::train_plain(0, o.run, data, model, cfg, baseline, on_step);
  else
    gpt::cuda::train_with_engine(devices, o.run, data, model, cfg, baseline, on_step);

  const double tps = timed_steps ? double(world) * o.run.batch * mc.seq_len * timed_steps / seconds : 0;
  std::printf("\nloss %.4f -> %.4f over %d steps (%s)\n", first_loss, last_loss, o.run.steps,
              last_loss < first_loss ? "falling" : "NOT falling");
  std::printf("final_loss: %.6f\ntokens_per_s: %.0f\nmfu: %.3f\ndevice_used_vs_plan: %.3f\n", last_loss, tps,
              tps * flops_token / (world * gemm_rate), worst_used);
  if (!o.plain) std::printf("engine_pool_vs_ledger: %.3f\n", worst_pool);
  return last_loss < first_loss ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "05_train_gpt_gpu: %s\n", e.what());
  return 2;
}

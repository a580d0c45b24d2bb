// 02_train_gpt: the main job. Trains a small GPT-style language model with zshard (ZeRO-3) on
// N thread ranks of one process, host backend, on a synthetic language it generates (or a
// text file you name). Every rank holds 1/N of every parameter, gradient and optimizer state;
// a module's full parameters exist only while its scope is open.
//
// Prints per step: loss (averaged over ranks), tokens/s, and the per-rank peak bytes by
// memory-ledger category; at the end a per-rank peak table. Run with --help for options.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpt/corpus.hpp"
#include "gpt/zshard_gpt.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/config/deepspeed_config.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/prefetch/pass_trace_prefetcher.hpp"
#include "zshard/trace/trace_sink.hpp"

namespace {

struct options {
  int ranks = 4;
  int steps = 200;
  int micro_batches = 1;     // per rank, per step (gradient accumulation)
  int batch = 8;             // sequences per micro-batch per rank
  gpt::gpt_config model{.vocab = 64, .seq_len = 64, .d_model = 128, .n_heads = 4, .n_layers = 4, .d_ff = 512};
  float lr = 3e-3f;
  double clip = 1.0;
  bool checkpoint = true;    // activation checkpointing per block
  bool bf16 = false;
  int eval_every = 25;
  int log_every = 10;
  std::string text;
  std::uint64_t seed = 1234;
  std::size_t persistence_threshold = 1024;  // biases and layer-norm gains stay replicated
  std::string deepspeed_config;  // a DeepSpeed JSON config to take sizes and hyper-parameters from
  std::string trace_file;        // Chrome/Perfetto trace of one step
  int trace_step = 3;
  bool help = false;
};

void usage() {
  std::printf(
      "usage: 02_train_gpt [options]\n"
      "  --ranks N          thread ranks (default 4)\n"
      "  --steps N          optimizer steps (default 200)\n"
      "  --micro N          micro-batches per step per rank, gradient accumulation (default 1)\n"
      "  --batch N          sequences per micro-batch per rank (default 8)\n"
      "  --seq N            sequence length (default 64)\n"
      "  --layers N         transformer blocks (default 4)\n"
      "  --d-model N        model width (default 128)\n"
      "  --heads N          attention heads (default 4)\n"
      "  --d-ff N           MLP width (default 512)\n"
      "  --lr X             AdamW learning rate (default 3e-3)\n"
      "  --clip X           global-norm gradient clipping, 0 = off (default 1.0)\n"
      "  --no-checkpoint    keep every block's activations (default: checkpoint each block,\n"
      "                     re-running its forward during backward)\n"
      "  --bf16             bf16 working parameters (fp32 master weights)\n"
      "  --eval-every N     no-grad evaluation pass every N steps, 0 = never (default 25)\n"
      "  --log-every N      print a step line every N steps (default 10)\n"
      "  --text FILE        train on the bytes of FILE instead of the synthetic language\n"
      "  --seed N           initialisation and data seed (default 1234)\n"
      "  --deepspeed-config FILE  take ZeRO-3 sizes, precision, clipping, AdamW and\n"
      "                     gradient_accumulation_steps from a DeepSpeed JSON config\n"
      "  --trace FILE       write a Chrome/Perfetto trace (engine events, each rank's ledger)\n"
      "                     of one step to FILE; tools/plot_memory.py draws it\n"
      "  --trace-step N     the step to trace (default 3: after the prefetch trace is recorded)\n");
}

options parse(int argc, char** argv) {
  options o;
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
    else if (a == "--ranks") o.ranks = positive(a, value(i));
    else if (a == "--steps") o.steps = positive(a, value(i));
    else if (a == "--micro") o.micro_batches = positive(a, value(i));
    else if (a == "--batch") o.batch = positive(a, value(i));
    else if (a == "--seq") o.model.seq_len = positive(a, value(i));
    else if (a == "--layers") o.model.n_layers = positive(a, value(i));
    else if (a == "--d-model") o.model.d_model = positive(a, value(i));
    else if (a == "--heads") o.model.n_heads = positive(a, value(i));
    else if (a == "--d-ff") o.model.d_ff = positive(a, value(i));
    else if (a == "--lr") o.lr = std::stof(value(i));
    else if (a == "--clip") o.clip = std::stod(value(i));
    else if (a == "--no-checkpoint") o.checkpoint = false;
    else if (a == "--bf16") o.bf16 = true;
    else if (a == "--eval-every") o.eval_every = std::stoi(value(i));
    else if (a == "--log-every") o.log_every = positive(a, value(i));
    else if (a == "--text") o.text = value(i);
    else if (a == "--seed") o.seed = std::stoull(value(i));
    else if (a == "--deepspeed-config") o.deepspeed_config = value(i);
    else if (a == "--trace") o.trace_file = value(i);
    else if (a == "--trace-step") o.trace_step = positive(a, value(i));
    else throw std::invalid_argument("unknown option '" + a + "' (try --help)");
  }
  if (o.ranks > 64) throw std::invalid_argument("--ranks: at most 64 thread ranks");
  if (!o.trace_file.empty() && o.trace_step > o.steps)
    throw std::invalid_argument("--trace-step " + std::to_string(o.trace_step) + " is after the last step (--steps " +
                                std::to_string(o.steps) + ")");
  return o;
}

// What rank r's ledger held at its peaks during the last step.
struct peak_row {
  std::size_t by_category[zshard::mem_category_count] = {};
  std::size_t total = 0;
};

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", double(bytes) / (1024.0 * 1024.0));
  return buf;
}

void print_peak_table(const std::vector<peak_row>& rows) {
  std::printf("\nper-rank peak over the run, MiB (ledger categories)\n%-5s", "rank");
  for (std::size_t c = 0; c < zshard::mem_category_count; ++c)
    std::printf(" %15s", std::string(zshard::to_string(zshard::mem_category(c))).c_str());
  std::printf(" %10s\n", "total");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::printf("%-5zu", r);
    for (std::size_t c = 0; c < zshard::mem_category_count; ++c) std::printf(" %15s", mib(rows[r].by_category[c]).c_str());
    std::printf(" %10s\n", mib(rows[r].total).c_str());
  }
}

// --deepspeed-config: sizes, precision, clipping, AdamW and micro-batches from the file (with the
// model's width for the Trainer's "auto" rules); unknown keys are warnings, the rest notes.
void apply_deepspeed(const gpt::gpt_config& mc, zshard::engine_config& cfg, options& o) {
  const auto ds = zshard::config::read_deepspeed_config(o.deepspeed_config, {.hidden_size = std::size_t(mc.d_model)});
  for (const auto& k : ds.unknown_keys)
    std::fprintf(stderr, "%s\n", ("02_train_gpt: warning: " + o.deepspeed_config + ": unknown key '" + k + "' ignored").c_str());
  for (const auto& n : ds.notes) std::printf("deepspeed config: %s\n", n.c_str());
  zshard::engine_config imported = ds.engine;
  imported.log = cfg.log;
  cfg = imported;
  o.bf16 = cfg.param_dtype == zshard::dtype::bf16;
  if (cfg.param_dtype == zshard::dtype::f16)
    std::printf("deepspeed config: fp16 working parameters with dynamic loss scaling\n");
  o.micro_batches = ds.gradient_accumulation_steps;
  if (ds.micro_batch_size) o.batch = *ds.micro_batch_size;
  o.lr = cfg.adamw.lr;
  if (ds.offload_optimizer)
    std::printf("deepspeed config: offload_optimizer cpu: on the host backend device memory is host memory, so this "
                "example keeps offload::on_device (zshard_plan --deepspeed-config shows the offloaded plan)\n");
}

// The plan's device peak per rank for this run (plan/memory_plan.hpp): the schedule the GPT
// runner follows, with the activation bytes it reported (it holds them all from the end of
// forward to the end of backward, so they are charged to the first module, which is released last).
std::size_t plan_peak(const gpt::zshard_model& model, const zshard::engine_config& cfg, int ranks, bool checkpoint,
                      int micro_batches, std::size_t activation_bytes) {
  zshard::plan::step_schedule s;
  s.micro_batches = micro_batches;
  s.modules.push_back({.module = model.embed, .kept_bytes = activation_bytes});
  for (zshard::module_id b : model.blocks) s.modules.push_back({.module = b, .recomputed = checkpoint});
  s.modules.push_back({.module = model.head});
  zshard::engine_config plain = cfg;
  plain.trace = nullptr;
  return zshard::plan::plan_memory(model.spec, plain, ranks, s).device.total_peak;
}

// One prefetch trace per kind of pass: the evaluation every --eval-every steps replays its own.
struct example_policies : zshard::default_policies {
  using prefetcher = zshard::prefetch::pass_trace;
};

}  // namespace

int main(int argc, char** argv) try {
  options o = parse(argc, argv);
  if (o.help) {
    usage();
    return 0;
  }
  const gpt::corpus data = o.text.empty() ? gpt::corpus::synthetic(o.seed, o.model.vocab)
                                          : gpt::corpus::from_file(o.text, o.model.seq_len, o.seed);
  gpt::gpt_config mc = o.model;
  mc.vocab = data.vocab();
  const gpt::zshard_model model = gpt::make_zshard_model(mc, o.seed);

  zshard::engine_config cfg;
  cfg.param_dtype = o.bf16 ? zshard::dtype::bf16 : zshard::dtype::f32;
  cfg.partition.persistence_threshold_numel = o.persistence_threshold;
  cfg.adamw.lr = o.lr;
  cfg.adamw.weight_decay = 0.01f;
  cfg.clip_norm = o.clip;
  cfg.reduce.reduce_bucket_numel = 1 << 16;
  if (!o.deepspeed_config.empty()) apply_deepspeed(mc, cfg, o);

  zshard::trace_sink trace;
  if (!o.trace_file.empty()) {
    cfg.trace = &trace;
    trace.set_recording(false);  // on for --trace-step only
  }

  const std::size_t total = model.spec.total_numel();
  std::printf("zshard GPT example: %d thread ranks, %zu parameters (%.2f MiB f32) in %zu modules, %s data, vocab %d\n",
              o.ranks, total, double(total) * 4 / (1 << 20), model.spec.modules().size(),
              o.text.empty() ? "synthetic" : o.text.c_str(), mc.vocab);
  std::printf("  layers %d, d_model %d, heads %d, d_ff %d, seq %d; batch %d x %d micro-batch(es) per rank; %s; %s\n",
              mc.n_layers, mc.d_model, mc.n_heads, mc.d_ff, mc.seq_len, o.batch, o.micro_batches,
              o.bf16 ? "bf16 working params" : "f32 params", o.checkpoint ? "activation checkpointing" : "no checkpointing");

  std::mutex mu;
  std::vector<peak_row> step_peaks(static_cast<std::size_t>(o.ranks)), run_peaks(static_cast<std::size_t>(o.ranks));
  double first_loss = 0, last_loss = 0;
  std::size_t activation_peak = 0;  // bytes, any rank (the same on every rank)

  zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) {
    const int rank = comm.rank();
    zshard::host_backend backend(std::nullopt, "rank " + std::to_string(rank));
    zshard::engine<zshard::host_backend, zshard::thread_comm, example_policies> eng(backend, comm, model.spec, cfg);
    gpt::zshard_gpt_runner<decltype(eng)> runner(eng, model, o.checkpoint);
    const int T = mc.seq_len;
    auto clock_start = std::chrono::steady_clock::now();
    for (int step = 1; step <= o.steps; ++step) {
      const bool traced = cfg.trace && step == o.trace_step;
      if (traced) {  // every rank is between steps: the traced window is exactly this step
        comm.barrier();
        if (rank == 0) trace.set_recording(true);
        comm.barrier();
      }
      backend.ledger().reset_peaks();
      double loss = 0;
      for (int mb = 0; mb < o.micro_batches; ++mb) {
        // global batch = all ranks' rows; this rank takes its own rows of it
        const std::uint64_t index = std::uint64_t(step - 1) * std::uint64_t(o.micro_batches) + std::uint64_t(mb);
        loss += runner.train_micro_batch(data.get_rows(index, rank * o.batch, o.batch, T));
      }
      const zshard::step_report rep = eng.step();
      if (traced) {
        comm.barrier();
        if (rank == 0) trace.set_recording(false);
      }
      float mean_loss = float(loss / o.micro_batches);
      comm.all_reduce(&mean_loss, &mean_loss, 1, zshard::dtype::f32, zshard::reduce_op::average);
      {
        std::lock_guard lock(mu);
        auto& row = step_peaks[static_cast<std::size_t>(rank)];
        auto& run = run_peaks[static_cast<std::size_t>(rank)];
        for (std::size_t c = 0; c < zshard::mem_category_count; ++c) {
          row.by_category[c] = backend.ledger().peak(zshard::mem_category(c));
          run.by_category[c] = std::max(run.by_category[c], row.by_category[c]);
        }
        row.total = backend.ledger().total_peak();
        run.total = std::max(run.total, row.total);
        const std::size_t act = backend.ledger().peak(zshard::mem_category::activations);
        activation_peak = std::max(activation_peak, act);
      }
      comm.barrier();  // every rank's peaks are in before rank 0 prints them
      if (rank == 0) {
        if (step == 1) first_loss = mean_loss;
        last_loss = mean_loss;
        if (step % o.log_every == 0 || step == 1 || step == o.steps) {
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
          const int steps_done = step % o.log_every == 0 ? o.log_every : (step == 1 ? 1 : step % o.log_every);
          const double tokens = double(steps_done) * o.ranks * o.micro_batches * o.batch * T;
          std::lock_guard lock(mu);
          const auto& p = step_peaks[0];
          std::size_t max_total = 0;
          for (const auto& r : step_peaks) max_total = std::max(max_total, r.total);
          std::printf("step %4d  loss %.4f  %7.0f tok/s  grad-norm %.3f%s  peak/rank MiB: params %s gathered %s "
                      "buckets %s grads %s optim %s activ %s | total r0 %s max %s\n",
                      step, mean_loss, tokens / secs, rep.grad_norm, rep.skipped ? " (skipped)" : "",
                      mib(p.by_category[0]).c_str(), mib(p.by_category[1]).c_str(), mib(p.by_category[2]).c_str(),
                      mib(p.by_category[3]).c_str(), mib(p.by_category[4]).c_str(), mib(p.by_category[5]).c_str(),
                      mib(p.total).c_str(), mib(max_total).c_str());
          if (!rep.swept.empty()) std::printf("  note: %zu module use(s) swept without backward\n", rep.swept.size());
          std::fflush(stdout);
          clock_start = std::chrono::steady_clock::now();
        }
      }
      comm.barrier();  // rank 0 has read the peaks before they are overwritten
      if (o.eval_every > 0 && step % o.eval_every == 0) {
        // batches the training loop never draws (indices past its range)
        float eval_loss = float(runner.evaluate(data.get_rows(1'000'000 + std::uint64_t(step), rank * o.batch, o.batch, T)));
        comm.all_reduce(&eval_loss, &eval_loss, 1, zshard::dtype::f32, zshard::reduce_op::average);
        if (rank == 0) std::printf("  eval (no-grad pass) loss %.4f\n", eval_loss);
      }
    }
  });
  print_peak_table(run_peaks);
  if (!o.trace_file.empty()) {
    const std::size_t planned =
        plan_peak(model, cfg, o.ranks, o.checkpoint, o.micro_batches, activation_peak);
    trace.set_metadata("plan_peak_bytes", double(planned));
    trace.set_metadata("traced_step", o.trace_step);
    trace.write_file(o.trace_file);
    std::printf("\ntrace of step %d written to %s (open it in ui.perfetto.dev; plan peak %s MiB per rank)\n",
                o.trace_step, o.trace_file.c_str(), mib(planned).c_str());
  }
  std::printf("\nloss %.4f -> %.4f over %d steps (%s)\n", first_loss, last_loss, o.steps,
              last_loss < first_loss ? "falling" : "NOT falling");
  return last_loss < first_loss ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "02_train_gpt: %s\n", e.what());
  return 2;
}

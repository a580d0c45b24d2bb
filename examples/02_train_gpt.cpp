// 02_train_gpt: the main job. Trains a small GPT-style language model with zshard (ZeRO-3) on
// N thread ranks of one process, host backend, on a synthetic language it generates (or a
// text file you name). Every rank holds 1/N of every parameter, gradient and optimizer state;
// a module's full parameters exist only while its scope is open.
//
// Prints per step: loss (averaged over ranks), tokens/s, and the per-rank peak bytes by
// memory-ledger category; at the end a per-rank peak table. With --profile, also where a
// step's time goes (the model's compute, zshard's engine, communication, the optimizer), per
// log interval on rank 0 and per rank at the end. Run with --help for options.
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
#include "zshard/engine/engine.hpp"

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
  bool profile = false;
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
      "  --profile          print the share of a step in compute, engine, communication and optimizer\n");
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
    else if (a == "--profile") o.profile = true;
    else throw std::invalid_argument("unknown option '" + a + "' (try --help)");
  }
  if (o.ranks > 64) throw std::invalid_argument("--ranks: at most 64 thread ranks");
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

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
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

  std::vector<gpt::step_profile> profiles(static_cast<std::size_t>(o.ranks));

  zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) {
    const int rank = comm.rank();
    // The engine's collectives go through a timing wrapper (the loop's own loss average and
    // barriers below use `comm` directly and are not part of a step).
    double comm_seconds = 0;
    gpt::timed_comm<zshard::thread_comm> engine_comm(comm, comm_seconds);
    zshard::host_backend backend(std::nullopt, "rank " + std::to_string(rank));
    zshard::engine<zshard::host_backend, gpt::timed_comm<zshard::thread_comm>> eng(backend, engine_comm, model.spec, cfg);
    gpt::zshard_gpt_runner<decltype(eng)> runner(eng, model, o.checkpoint);
    gpt::step_profile interval, whole;  // this rank's, since the last log line / over the run
    if (o.profile) runner.time_compute_into(&interval.compute);
    const int T = mc.seq_len;
    auto clock_start = std::chrono::steady_clock::now();
    for (int step = 1; step <= o.steps; ++step) {
      backend.ledger().reset_peaks();
      double loss = 0;
      const auto t0 = std::chrono::steady_clock::now();
      const double comm0 = comm_seconds;
      for (int mb = 0; mb < o.micro_batches; ++mb) {
        // global batch = all ranks' rows; this rank takes its own rows of it
        const std::uint64_t index = std::uint64_t(step - 1) * std::uint64_t(o.micro_batches) + std::uint64_t(mb);
        loss += runner.train_micro_batch(data.get_rows(index, rank * o.batch, o.batch, T));
      }
      const auto t1 = std::chrono::steady_clock::now();
      const double comm1 = comm_seconds;
      const zshard::step_report rep = eng.step();
      const auto t2 = std::chrono::steady_clock::now();
      interval.total += std::chrono::duration<double>(t2 - t0).count();
      interval.optimizer += std::chrono::duration<double>(t2 - t1).count();
      interval.comm += comm_seconds - comm0;
      interval.comm_in_step += comm_seconds - comm1;
      ++interval.steps;
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
          if (o.profile) interval.print("  rank 0 step time: ");
          std::fflush(stdout);
          clock_start = std::chrono::steady_clock::now();
        }
      }
      comm.barrier();  // rank 0 has read the peaks before they are overwritten
      if (rank != 0 || step % o.log_every == 0 || step == 1 || step == o.steps) {  // rank 0 printed it
        whole += interval;
        interval.clear();
      }
      if (o.eval_every > 0 && step % o.eval_every == 0) {
        // batches the training loop never draws (indices past its range); not part of a step
        runner.time_compute_into(nullptr);
        const double comm_before_eval = comm_seconds;
        float eval_loss = float(runner.evaluate(data.get_rows(1'000'000 + std::uint64_t(step), rank * o.batch, o.batch, T)));
        comm_seconds = comm_before_eval;
        if (o.profile) runner.time_compute_into(&interval.compute);
        comm.all_reduce(&eval_loss, &eval_loss, 1, zshard::dtype::f32, zshard::reduce_op::average);
        if (rank == 0) std::printf("  eval (no-grad pass) loss %.4f\n", eval_loss);
      }
    }
    whole += interval;
    std::lock_guard lock(mu);
    profiles[static_cast<std::size_t>(rank)] = whole;
  });
  print_peak_table(run_peaks);
  if (o.profile) {
    std::printf("\nwhere a step's time goes, per rank (compute: the model's math; engine: zshard's scopes and\n"
                "memory traffic; communication: collectives, waiting for peers included; optimizer: step()\n"
                "without its collectives)\n");
    for (std::size_t r = 0; r < profiles.size(); ++r) {
      const std::string prefix = "  rank " + std::to_string(r) + ": ";
      profiles[r].print(prefix.c_str());
    }
  }
  std::printf("\nloss %.4f -> %.4f over %d steps (%s)\n", first_loss, last_loss, o.steps,
              last_loss < first_loss ? "falling" : "NOT falling");
  return last_loss < first_loss ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "02_train_gpt: %s\n", e.what());
  return 2;
}

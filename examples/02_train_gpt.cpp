// 02_train_gpt: the main job. Trains a small GPT-style language model with zshard (ZeRO-3) on
// N thread ranks of one process (default), or one MPI process per rank (--mpi, started by
// mpirun: scripts/run_example.sh --mpi 4), host backend, on a synthetic language it generates
// (or a text file you name). Both modes give the same losses bit for bit. Every rank holds 1/N of every parameter, gradient and optimizer state;
// a module's full parameters exist only while its scope is open.
//
// Prints per step: loss (averaged over ranks), tokens/s, and the per-rank peak bytes by
// memory-ledger category; at the end a per-rank peak table. With --profile, also where a
// step's time goes (the model's compute, zshard's engine, communication, the optimizer), per
// log interval on rank 0 and per rank at the end. Run with --help for options.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "gpt/corpus.hpp"
#include "gpt/run_record.hpp"
#include "gpt/train_options.hpp"
#include "gpt/zshard_gpt.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/checkpoint/checkpoint.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/config/deepspeed_config.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/prefetch/pass_trace_prefetcher.hpp"
#include "zshard/trace/trace_sink.hpp"
#ifdef ZSHARD_EXAMPLE_MPI
#include "zshard/comm/mpi_run.hpp"
#endif

namespace {

using options = gpt::train_options;

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

// What rank 0 keeps of a run.
struct run_result {
  int first_step = 1;  // later than 1 when resumed from a checkpoint
  double first_loss = 0, last_loss = 0;
  std::uint32_t last_loss_bits = 0;
  std::vector<peak_row> run_peaks;
  std::vector<gpt::step_profile> profiles;  // per rank, with --profile
};

// One prefetch trace per kind of pass: the evaluation every --eval-every steps replays its own.
struct example_policies : zshard::default_policies {
  using prefetcher = zshard::prefetch::pass_trace;
};

// --trace: one step's engine events and ledgers. Thread ranks share one sink (rank 0 switches
// it on and off between barriers); each MPI process has its own and records only itself.
struct trace_request {
  zshard::trace_sink* sink = nullptr;
  int step = 0;
  bool shared = true;
};

// One rank's training, the same code on thread ranks and MPI processes. The per-rank peaks
// reach rank 0 by an all-gather, so nothing is shared between ranks but the communicator.
template <class Comm>
void train_rank(Comm& comm, const options& o, const gpt::corpus& data, const gpt::gpt_config& mc,
                const gpt::zshard_model& model, const zshard::engine_config& cfg, const trace_request& trace,
                const zshard::config::deepspeed_settings* ds, run_result& out) {
  const int rank = comm.rank(), world = comm.size();
  if (ds) ds->check_batch_size(world, o.batch, o.micro_batches);  // every rank alike
  // The engine's collectives go through a timing wrapper (the loop's own loss average and peak
  // exchange below use `comm` directly and are not part of a step).
  double comm_seconds = 0;
  gpt::timed_comm<Comm> engine_comm(comm, comm_seconds);
  zshard::host_backend backend(std::nullopt, "rank " + std::to_string(rank));
  zshard::engine<zshard::host_backend, gpt::timed_comm<Comm>, example_policies> eng(backend, engine_comm, model.spec,
                                                                                    cfg);
  gpt::zshard_gpt_runner<decltype(eng)> runner(eng, model, o.checkpoint);
  gpt::step_profile interval, whole;  // this rank's, since the last log line / over the run
  if (o.profile) runner.time_compute_into(&interval.compute);
  const int T = mc.seq_len;
  static_assert(sizeof(peak_row) % sizeof(float) == 0, "peak rows travel as f32 words");
  constexpr std::size_t row_words = sizeof(peak_row) / sizeof(float);
  std::vector<peak_row> step_peaks(static_cast<std::size_t>(world)), run_peaks(static_cast<std::size_t>(world));
  // Batches are a function of the step and the global batch size, so a resumed run draws what
  // the uninterrupted one would, however the global batch is split over ranks.
  int start = 0;
  if (!o.resume.empty()) {
    const auto info = zshard::checkpoint::load(eng, o.resume);
    start = static_cast<int>(info.step);
    const float saved_lr = eng.lr();
    if (o.was_given("--lr")) eng.set_lr(o.lr);  // every rank alike
    if (rank == 0) {
      std::printf("resumed from %s at step %d (saved by %d rank(s))\n", info.path.c_str(), start, info.saved_world_size);
      const auto lines = gpt::describe_resume(gpt::run_record::parse(info.user_state),
                                              gpt::run_record::of(o, start, world, cfg.param_dtype), saved_lr, o);
      for (const auto& l : lines) std::printf("%s\n", l.c_str());
    }
  } else if (!o.init_from.empty()) {
    const auto rep = zshard::checkpoint::load_pretrained(eng, o.init_from);
    if (rank == 0) std::printf("loaded %zu pretrained parameters from %s\n", rep.loaded, o.init_from.c_str());
  }
  if (start >= o.steps)
    throw std::invalid_argument("nothing to train: the checkpoint is at step " + std::to_string(start) +
                                ", --steps is " + std::to_string(o.steps));
  if (rank == 0) out.first_step = start + 1;
  const auto save = [&](int step) {
    const auto s = zshard::checkpoint::save(
        eng, o.save_dir,
        {.keep_last = std::size_t(o.keep_last), .user_state = gpt::run_record::of(o, step, world, cfg.param_dtype).to_text()});
    if (rank == 0) std::printf("  saved %s\n", s.path.c_str());
  };
  auto clock_start = std::chrono::steady_clock::now();
  const auto set_recording = [&](bool on) {
    comm.barrier();  // every rank is between steps: the traced window is exactly this step
    if (rank == 0 || !trace.shared) trace.sink->set_recording(on);
    comm.barrier();
  };
  for (int step = start + 1; step <= o.steps; ++step) {
    const bool traced = trace.sink && step == trace.step;
    if (traced) set_recording(true);
    backend.ledger().reset_peaks();
    double loss = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const double comm0 = comm_seconds;
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      // rows [0, global batch) of data batch step - 1, whatever the split (gpt::first_row)
      const int first = gpt::first_row(mb, rank, world, o.batch);
      loss += runner.train_micro_batch(data.get_rows(std::uint64_t(step - 1), first, o.batch, T));
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
    if (traced) set_recording(false);
    float mean_loss = float(loss / o.micro_batches);
    comm.all_reduce(&mean_loss, &mean_loss, 1, zshard::dtype::f32, zshard::reduce_op::average);
    peak_row mine;
    for (std::size_t c = 0; c < zshard::mem_category_count; ++c)
      mine.by_category[c] = backend.ledger().peak(zshard::mem_category(c));
    mine.total = backend.ledger().total_peak();
    comm.all_gather(&mine, step_peaks.data(), row_words, zshard::dtype::f32);  // bytes, as f32 words: a copy
    for (std::size_t r = 0; r < run_peaks.size(); ++r) {
      for (std::size_t c = 0; c < zshard::mem_category_count; ++c)
        run_peaks[r].by_category[c] = std::max(run_peaks[r].by_category[c], step_peaks[r].by_category[c]);
      run_peaks[r].total = std::max(run_peaks[r].total, step_peaks[r].total);
    }
    const bool log_line = step % o.log_every == 0 || step == start + 1 || step == o.steps;
    if (rank == 0) {
      if (step == start + 1) out.first_loss = mean_loss;
      out.last_loss = mean_loss;
      out.last_loss_bits = std::bit_cast<std::uint32_t>(mean_loss);
      if (log_line) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
        const int steps_done = step % o.log_every == 0 ? o.log_every : (step == start + 1 ? 1 : step % o.log_every);
        const double tokens = double(steps_done) * world * o.micro_batches * o.batch * T;
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
    if (log_line) {  // rank 0 printed this interval; every rank starts the next one
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
    if (!o.save_dir.empty() && ((o.save_every > 0 && step % o.save_every == 0) || step == o.steps)) save(step);
  }
  if (!o.export_path.empty()) {
    zshard::checkpoint::export_engine(eng, o.export_path,
                                      {.type = o.export_bf16 ? zshard::dtype::bf16 : zshard::dtype::f32});
    if (rank == 0) std::printf("exported %s\n", o.export_path.c_str());
  }
  if (rank == 0) out.run_peaks = run_peaks;
  if (o.profile) {  // every rank's profile reaches rank 0, as the peaks do
    whole += interval;
    static_assert(sizeof(gpt::step_profile) % sizeof(float) == 0, "profiles travel as f32 words");
    std::vector<gpt::step_profile> all(static_cast<std::size_t>(world));
    comm.all_gather(&whole, all.data(), sizeof(gpt::step_profile) / sizeof(float), zshard::dtype::f32);
    if (rank == 0) out.profiles = std::move(all);
  }
}

void print_header(const options& o, int world, const char* kind, const gpt::gpt_config& mc,
                  const gpt::zshard_model& model, const zshard::engine_config& cfg) {
  const std::size_t total = model.spec.total_numel();
  std::printf("zshard GPT example: %d %s, %zu parameters (%.2f MiB f32) in %zu modules, %s data, vocab %d\n", world,
              kind, total, double(total) * 4 / (1 << 20), model.spec.modules().size(),
              o.text.empty() ? "synthetic" : o.text.c_str(), mc.vocab);
  std::printf("  layers %d, d_model %d, heads %d, d_ff %d, seq %d; batch %d x %d micro-batch(es) per rank; %s; %s\n",
              mc.n_layers, mc.d_model, mc.n_heads, mc.d_ff, mc.seq_len, o.batch, o.micro_batches,
              o.bf16 ? "bf16 working params" : "f32 params", o.checkpoint ? "activation checkpointing" : "no checkpointing");
  std::printf("  global batch %lld sequences per step; lr %g, clip %g", o.global_batch(world), double(cfg.adamw.lr),
              cfg.clip_norm);
  const int g = cfg.hybrid.shard_group_size;
  if (g > 0 && g != world && world % g == 0)
    std::printf("; hybrid sharding: %d replicas x shard groups of %d ranks", world / g, g);
  std::printf("\n");
  std::fflush(stdout);
}

// --trace: the traced step's events with the plan's peak beside them (under --mpi, rank 0's
// process holds rank 0's events only).
void write_trace(const options& o, const gpt::zshard_model& model, const zshard::engine_config& cfg, int world,
                 const run_result& res, zshard::trace_sink& trace) {
  if (o.trace_file.empty()) return;
  std::size_t activation_peak = 0;  // bytes, any rank (the same on every rank)
  for (const auto& r : res.run_peaks)
    activation_peak = std::max(activation_peak, r.by_category[std::size_t(zshard::mem_category::activations)]);
  const std::size_t planned = plan_peak(model, cfg, world, o.checkpoint, o.micro_batches, activation_peak);
  trace.set_metadata("plan_peak_bytes", double(planned));
  trace.set_metadata("traced_step", o.trace_step);
  trace.write_file(o.trace_file);
  std::printf("\ntrace of step %d written to %s (open it in ui.perfetto.dev; plan peak %s MiB per rank)\n",
              o.trace_step, o.trace_file.c_str(), mib(planned).c_str());
}

// Rank 0's closing lines; the loss bits let a script compare runs exactly (threads vs MPI).
int report(const options& o, const run_result& res) {
  print_peak_table(res.run_peaks);
  if (!res.profiles.empty()) {
    std::printf("\nwhere a step's time goes, per rank (compute: the model's math; engine: zshard's scopes and\n"
                "memory traffic; communication: collectives, waiting for peers included; optimizer: step()\n"
                "without its collectives)\n");
    for (std::size_t r = 0; r < res.profiles.size(); ++r) {
      const std::string prefix = "  rank " + std::to_string(r) + ": ";
      res.profiles[r].print(prefix.c_str());
    }
  }
  const int ran = o.steps - res.first_step + 1;
  const bool falling = ran < 2 || res.last_loss < res.first_loss;
  // A fresh run checks that the model learns (exit status 1 if not); one from trained weights
  // (--resume, --init-from) may well rise over a short stretch, so it only reports.
  const bool from_weights = !o.resume.empty() || !o.init_from.empty();
  std::printf("\nloss %.4f -> %.4f over %d steps (%s)\n", res.first_loss, res.last_loss, ran,
              falling ? "falling" : from_weights ? "not falling: a short run from trained weights may rise"
                                                 : "NOT falling: exit status 1");
  std::printf("final loss bits: 0x%08x\n", static_cast<unsigned>(res.last_loss_bits));
  std::printf("final_loss: %.9g\n", res.last_loss);
  return falling || from_weights ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  options o = gpt::parse_options(argc, argv);
  if (o.help) {
    gpt::print_usage();
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
  std::optional<zshard::config::deepspeed_settings> ds;
  if (!o.deepspeed_config.empty()) ds = gpt::apply_deepspeed(mc, cfg, o);
  const zshard::config::deepspeed_settings* dsp = ds ? &*ds : nullptr;

  zshard::trace_sink trace;
  trace_request traced;
  if (!o.trace_file.empty()) {
    cfg.trace = &trace;
    trace.set_recording(false);  // on for --trace-step only
    traced = {.sink = &trace, .step = o.trace_step, .shared = !o.mpi};
  }
  run_result res;
  if (o.mpi) {
#ifdef ZSHARD_EXAMPLE_MPI
    int rank = 0, world = 0;
    zshard::run_mpi(argc, argv, [&](zshard::mpi_comm& comm) {
      rank = comm.rank();
      world = comm.size();
      if (rank == 0) print_header(o, comm.size(), "MPI processes", mc, model, cfg);
      train_rank(comm, o, data, mc, model, cfg, traced, dsp, res);
    });
    if (rank == 0) write_trace(o, model, cfg, world, res, trace);
    return rank == 0 ? report(o, res) : 0;
#else
    throw std::invalid_argument("--mpi: this build has no MPI (install libopenmpi-dev and openmpi-bin, reconfigure)");
#endif
  }
  if (ds) ds->check_batch_size(o.ranks, o.batch, o.micro_batches);
  print_header(o, o.ranks, "thread ranks", mc, model, cfg);
  zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) {
    train_rank(comm, o, data, mc, model, cfg, traced, dsp, res);
  });
  write_trace(o, model, cfg, o.ranks, res, trace);
  return report(o, res);
} catch (const std::exception& e) {
  std::fprintf(stderr, "02_train_gpt: %s\n", e.what());
  return 2;
}

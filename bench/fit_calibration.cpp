// fit_calibration: does zshard_plan --fit's time model (plan/fit_time_model.hpp) predict real
// steps? The main job (02_train_gpt's model and loop: the GPT example through zshard on thread
// ranks, host backend) is run under a dozen configurations (1-4 ranks, micro-batch and
// accumulation, checkpointing, the optimizer on the device or in host_adam), and each measured
// step time is set beside the time model's prediction for the same candidate, planned by the
// same planner, with the host backend's rates measured in the same run by the code behind
// zshard_plan --fit --gpu host --calibrate-host (tools/fit_host_calibration.hpp) right before and
// right after each configuration's run, with as many threads at once as it has ranks (ranks
// share this machine's cores; its load drifts), the mean of the two.
//
// The machine is shared: other processes' load moves both sides, which is why the rates are
// measured right before and after each configuration; the header prints the load average.
// Prints the rates, a table (measured and predicted ms per step, the error, the predicted
// terms), then the key figures last: fit_rank_correlation (Spearman's rank correlation of
// predicted and measured step times; target >= 0.9) and fit_time_error_median (the median of
// |predicted - measured| / measured; target <= 0.25).
//
// Usage: fit_calibration [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../tools/fit_gpt_example.hpp"
#include "../tools/fit_host_calibration.hpp"
#include "gpt/corpus.hpp"
#include "gpt/train_options.hpp"
#include "gpt/zshard_gpt.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/plan/fit_search.hpp"

namespace {

using namespace zshard::plan;
using clock_type = std::chrono::steady_clock;

struct run_config {
  int ranks = 1, micro_batch = 8, accumulation = 1;
  bool checkpoint = true;
  fit_optimizer optimizer = fit_optimizer::device;
};

struct host_adam_policies : zshard::default_policies {
  using offloader = zshard::offload::host_adam;
};

// The main job's engine options (02_train_gpt, f32).
zshard::engine_config main_job_config() {
  zshard::engine_config cfg;
  cfg.partition.persistence_threshold_numel = 1024;
  cfg.adamw.lr = 3e-3f;
  cfg.adamw.weight_decay = 0.01f;
  cfg.clip_norm = 1.0;
  cfg.reduce.reduce_bucket_numel = 1 << 16;
  cfg.offload.host_threads = 1;  // thread ranks share the cores: one optimizer thread each
  cfg.log = [](const std::string&) {};
  return cfg;
}

// Seconds per optimizer step of the main job's loop under `rc`: the median over the measured
// steps of the slowest rank's time (the ranks run in step; a step another process preempted
// moves the median little).
template <class Policies>
double measure_step(const gpt::corpus& data, const gpt::gpt_config& c, const run_config& rc, int warmup, int steps) {
  const gpt::zshard_model model = gpt::make_zshard_model(c, 1234);
  const zshard::engine_config cfg = main_job_config();
  std::mutex mu;
  std::vector<double> slowest(std::size_t(steps), 0.0);
  zshard::run_ranks(rc.ranks, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend(std::nullopt, "rank " + std::to_string(comm.rank()));
    zshard::engine<zshard::host_backend, zshard::thread_comm, Policies> eng(backend, comm, model.spec, cfg);
    gpt::zshard_gpt_runner<decltype(eng)> runner(eng, model, rc.checkpoint);
    std::vector<double> mine;
    for (int s = 0; s < warmup + steps; ++s) {
      comm.barrier();
      const auto t0 = clock_type::now();
      for (int mb = 0; mb < rc.accumulation; ++mb)
        runner.train_micro_batch(data.get_rows(std::uint64_t(s), gpt::first_row(mb, comm.rank(), rc.ranks, rc.micro_batch),
                                               rc.micro_batch, c.seq_len));
      eng.step();
      if (s >= warmup) mine.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    std::lock_guard lock(mu);
    for (std::size_t i = 0; i < mine.size(); ++i) slowest[i] = std::max(slowest[i], mine[i]);
  });
  std::sort(slowest.begin(), slowest.end());
  return slowest.size() % 2 ? slowest[slowest.size() / 2]
                            : 0.5 * (slowest[slowest.size() / 2 - 1] + slowest[slowest.size() / 2]);
}

// The time model's prediction for `rc` on this machine's measured rates.
step_time_terms predict(const fit_model& model, const run_config& rc, const gpu_rates& rates) {
  fit_problem pr;
  pr.model = model;
  pr.machine = {rates, rc.ranks, 1};
  pr.global_batch_tokens = std::int64_t(rc.ranks) * rc.micro_batch * rc.accumulation * model.seq_len;
  pr.base = main_job_config();
  const zshard::engine_config& base = pr.base;
  fit_candidate c;
  c.family = {3, rc.optimizer, zshard::offload_tier::device, rc.ranks};
  c.prefetch_numel = base.prefetch.prefetch_numel;
  c.max_live_numel = base.prefetch.max_live_numel;
  c.bucket_numel = base.reduce.reduce_bucket_numel;
  c.step = {rc.micro_batch, rc.accumulation, rc.checkpoint ? 1 : 0};
  zshard::engine_config cfg = config_of(c, base, pr.machine, "");
  const fit_entry e = evaluate_candidate(pr, c, cfg);
  if (e.outcome != fit_outcome::fits) std::printf("  (the plan says: %s)\n", e.reason.c_str());
  return e.time;
}

// Spearman's rank correlation (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<std::size_t> idx(v.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) { return v[x] < v[y]; });
    std::vector<double> r(v.size());
    for (std::size_t i = 0; i < idx.size();) {
      std::size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (std::size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j) + 1;
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  const double n = double(a.size());
  double ma = 0, mb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string_view(argv[1]) == "--quick";
  const int warmup = 2, steps = quick ? 5 : 11;
  const gpt::gpt_config c = zshard_tools::main_job_model();
  const gpt::corpus data = gpt::corpus::synthetic(1234, c.vocab);
  const fit_model model = zshard_tools::gpt_fit_model(c);
  const std::vector<run_config> configs = {
      {1, 4, 1, false, fit_optimizer::device}, {1, 8, 1, true, fit_optimizer::device},
      {1, 16, 1, false, fit_optimizer::host},  {1, 4, 4, true, fit_optimizer::host},
      {2, 4, 1, true, fit_optimizer::device},  {2, 8, 2, false, fit_optimizer::device},
      {2, 16, 1, true, fit_optimizer::host},   {3, 2, 2, false, fit_optimizer::device},
      {3, 8, 1, true, fit_optimizer::host},    {4, 2, 1, false, fit_optimizer::device},
      {4, 8, 1, true, fit_optimizer::device},  {4, 4, 2, false, fit_optimizer::host},
  };
  double load = 0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  std::printf("the main job's model (%zu parameters) on the host backend, f32; %d warm-up + %d measured steps%s; "
              "%u hardware threads, load average %.2f\n",
              model.param_count(), warmup, steps, quick ? " (--quick)" : "", std::thread::hardware_concurrency(), load);
  std::printf("\n%5s %9s %-5s %-7s %10s %10s %7s  %9s %9s %9s %9s %9s\n", "ranks", "mb x acc", "ckpt", "optim",
              "meas ms", "pred ms", "error", "compute", "recomp", "gather", "reduce", "optim");
  std::vector<double> measured, predicted, errors;
  int calibrated_for = 0;
  gpu_rates rates;
  for (const run_config& rc : configs) {
    // the rates for this rank count, measured right before and right after its run (the
    // machine's load drifts; the mean of the two is what the prediction uses)
    const double budget = quick ? 0.1 : 0.25;
    const zshard_tools::host_measurement before = zshard_tools::measure_host(rc.ranks, c, 8, budget);
    const double m = rc.optimizer == fit_optimizer::device
                         ? measure_step<zshard::default_policies>(data, c, rc, warmup, steps)
                         : measure_step<host_adam_policies>(data, c, rc, warmup, steps);
    const zshard_tools::host_measurement h =
        zshard_tools::mean_of(before, zshard_tools::measure_host(rc.ranks, c, 8, budget));
    rates = zshard_tools::host_rates(h, *gpu_kind_named("host"));
    if (rc.ranks != calibrated_for)
      std::printf("-- %d rank thread(s): GEMM %.2f GFLOP/s, the main job's step %.2f GFLOP/s (efficiency %.2f), AdamW "
                  "%.3f G/s, all_gather %.2f GB/s, %.1f us per collective\n",
                  rc.ranks, h.gemm_gflops, h.model_gflops, rates.compute_efficiency, h.adam_gelems, h.comm_gbps,
                  h.latency_us);
    calibrated_for = rc.ranks;
    const step_time_terms t = predict(model, rc, rates);
    const double err = std::abs(t.total - m) / m;
    measured.push_back(m);
    predicted.push_back(t.total);
    errors.push_back(err);
    char shape[16];
    std::snprintf(shape, sizeof shape, "%d x %d", rc.micro_batch, rc.accumulation);
    std::printf("%5d %9s %-5s %-7s %10.2f %10.2f %6.1f%%  %9.2f %9.2f %9.2f %9.2f %9.2f\n", rc.ranks, shape,
                rc.checkpoint ? "on" : "off", to_string(rc.optimizer), 1e3 * m, 1e3 * t.total, 100 * err,
                1e3 * t.compute, 1e3 * t.recompute, 1e3 * t.gather, 1e3 * t.reduce, 1e3 * t.optimizer);
    std::fflush(stdout);
  }
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                          : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  std::printf("\nfit_configurations: %zu\n", configs.size());
  std::printf("fit_time_error_max: %.3f\n", sorted.back());
  std::printf("fit_rank_correlation: %.3f\n", spearman(predicted, measured));
  std::printf("fit_time_error_median: %.3f\n", median);
  return 0;
}

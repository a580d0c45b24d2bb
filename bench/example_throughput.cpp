// example_throughput: how fast does the main job (02_train_gpt: the GPT example trained through
// zshard on thread ranks, host backend) run, and where does a step's time go, next to a plain
// single-process loop of the same model without zshard, in the same run?
//
// Rows, each after a warm-up, on the example's default model (4 blocks, d_model 128, 1.3M
// parameters) and its per-rank batch (8 x 64 tokens), f32, clipping at 1.0, no checkpointing
// (so the plain loop does the same math; checkpointing adds a block forward per block):
//   plain      one thread: forward_backward over the plain model, global-norm clipping and
//              AdamW (the host AdamW kernel, best vector path) per parameter: no zshard
//   zshard N   N thread ranks (data parallel, global batch N x 8 rows): the example's loop
//   no cache   1 rank with the host backend's block cache off (every free back to the heap,
//              as before the cache): what the page faults were
// tok/s = tokens trained per second (all ranks). The breakdown is the mean over ranks of
// step_profile (examples/gpt/step_profile.hpp): compute (the model's math), engine (zshard's
// scopes and memory traffic), communication (collectives, waiting for peers included),
// optimizer (step() without collectives). faults/step = minor page faults of the rank threads
// per step (getrusage, RUSAGE_THREAD) after warm-up.
// The example's matmuls (its linear layers' forward and backward GEMMs on its shapes) are timed
// next to Eigen's 1024^3 single-precision GEMM: GFLOP/s.
//
// Key figures: example_tokens_per_s_vs_plain (1 rank / plain), step_engine_comm_share (2 ranks:
// (engine + communication) / step), example_gemm_vs_eigen_peak, host_backend_page_faults_per_step
// (1 rank, cache on), and the same without the cache.
//
// Usage: example_throughput [--quick]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gpt/corpus.hpp"
#include "gpt/step_profile.hpp"
#include "gpt/zshard_gpt.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/optim/adamw_dispatch.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
constexpr int batch_rows = 8;
constexpr std::uint64_t seed = 1234;

gpt::gpt_config model_config(int vocab) {
  return {.vocab = vocab, .seq_len = 64, .d_model = 128, .n_heads = 4, .n_layers = 4, .d_ff = 512};
}

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

long thread_minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// ---- the plain loop ---------------------------------------------------------------------------
double plain_tokens_per_s(const gpt::corpus& data, int warmup, int steps) {
  const gpt::gpt_config c = model_config(data.vocab());
  gpt::plain_model<float> m(c, seed);
  gpt::model_workspace<float> ws;
  std::vector<std::vector<std::vector<float>>> mom(m.modules.size()), var(m.modules.size());
  for (std::size_t k = 0; k < m.modules.size(); ++k)
    for (const auto& v : m.modules[k].values) {
      mom[k].emplace_back(v.size(), 0.0f);
      var[k].emplace_back(v.size(), 0.0f);
    }
  zshard::optim::adamw_config acfg;
  acfg.lr = 3e-3f;
  acfg.weight_decay = 0.01f;
  const zshard::optim::simd_path path = zshard::optim::best_path();
  clock_type::time_point t0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) t0 = clock_type::now();
    const gpt::batch b = data.get_rows(std::uint64_t(s), 0, batch_rows, c.seq_len);
    m.zero_grad();
    gpt::forward_backward(m, b.tokens, b.targets, b.batch_size, b.seq_len, ws);
    double sq = 0;
    for (auto& mod : m.modules)
      for (auto& g : mod.grads)
        for (float x : g) sq += double(x) * double(x);
    const double norm = std::sqrt(sq), clip = norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0;
    for (std::size_t k = 0; k < m.modules.size(); ++k) {
      for (std::size_t j = 0; j < m.modules[k].values.size(); ++j) {
        const auto st = zshard::optim::make_adamw_step(acfg, s + 1, float(clip), m.desc[k].params[j].decay);
        auto& v = m.modules[k].values[j];
        zshard::optim::adamw_update_on(path, st, v.data(), mom[k][j].data(), var[k][j].data(),
                                       m.modules[k].grads[j].data(), v.size(), nullptr, zshard::dtype::f32);
      }
    }
  }
  return double(steps) * batch_rows * c.seq_len / seconds(clock_type::now() - t0);
}

// ---- the main job through zshard --------------------------------------------------------------
struct zshard_row {
  std::string name;
  int ranks = 1;
  double tokens_per_s = 0;
  gpt::step_profile profile;  // summed over ranks
  double faults_per_step = 0;  // per rank
};

template <class Backend>
Backend make_backend(int rank, bool cache) {
  if constexpr (std::is_constructible_v<Backend, std::nullopt_t, std::string, std::size_t>) {
    if (!cache) return Backend(std::nullopt, "rank " + std::to_string(rank), std::size_t{0});
  }
  return Backend(std::nullopt, "rank " + std::to_string(rank));
}

// The runner times its compute when it can (a runner from before step_profile cannot: the
// breakdown then counts the model's math as engine time).
template <class Runner>
void time_compute(Runner& r, double* into) {
  if constexpr (requires { r.time_compute_into(into); }) r.time_compute_into(into);
}

zshard_row run_zshard(const gpt::corpus& data, int ranks, int warmup, int steps, bool cache) {
  const gpt::gpt_config c = model_config(data.vocab());
  const gpt::zshard_model model = gpt::make_zshard_model(c, seed);
  zshard::engine_config cfg;  // as 02_train_gpt sets it
  cfg.partition.persistence_threshold_numel = 1024;
  cfg.adamw.lr = 3e-3f;
  cfg.adamw.weight_decay = 0.01f;
  cfg.clip_norm = 1.0;
  cfg.reduce.reduce_bucket_numel = 1 << 16;
  cfg.log = [](const std::string&) {};
  zshard_row row;
  row.ranks = ranks;
  std::mutex mu;
  double wall = 0;
  long faults = 0;
  zshard::run_ranks(ranks, [&](zshard::thread_comm& comm) {
    double comm_seconds = 0;
    gpt::timed_comm<zshard::thread_comm> engine_comm(comm, comm_seconds);
    // a function-local helper keeps the backend constructible from either library version
    zshard::host_backend backend = make_backend<zshard::host_backend>(comm.rank(), cache);
    zshard::engine<zshard::host_backend, gpt::timed_comm<zshard::thread_comm>> eng(backend, engine_comm, model.spec,
                                                                                   cfg);
    gpt::zshard_gpt_runner<decltype(eng)> runner(eng, model, /*checkpoint=*/false);
    gpt::step_profile p;
    time_compute(runner, &p.compute);
    long faults0 = 0;
    clock_type::time_point start;
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        comm.barrier();
        p.clear();
        faults0 = thread_minor_faults();
        start = clock_type::now();
      }
      const auto t0 = clock_type::now();
      const double comm0 = comm_seconds;
      runner.train_micro_batch(data.get_rows(std::uint64_t(s), comm.rank() * batch_rows, batch_rows, c.seq_len));
      const auto t1 = clock_type::now();
      const double comm1 = comm_seconds;
      eng.step();
      const auto t2 = clock_type::now();
      p.total += seconds(t2 - t0);
      p.optimizer += seconds(t2 - t1);
      p.comm += comm_seconds - comm0;
      p.comm_in_step += comm_seconds - comm1;
      ++p.steps;
    }
    const long my_faults = thread_minor_faults() - faults0;
    comm.barrier();
    const double my_wall = seconds(clock_type::now() - start);
    std::lock_guard lock(mu);
    row.profile += p;
    faults += my_faults;
    wall = std::max(wall, my_wall);
  });
  row.tokens_per_s = double(steps) * ranks * batch_rows * c.seq_len / wall;
  row.faults_per_step = double(faults) / double(steps) / ranks;
  return row;
}

// ---- GEMM: the example's shapes vs Eigen's peak -------------------------------------------------
template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = -1; r < reps; ++r) {
    const auto t0 = clock_type::now();
    f();
    if (r >= 0) best = std::min(best, seconds(clock_type::now() - t0));
  }
  return best;
}

double eigen_gemm_gflops(int n, int reps) {
  gpt::mat<float> a = gpt::mat<float>::Random(n, n), b = gpt::mat<float>::Random(n, n), c(n, n);
  const double t = best_seconds(reps, [&] { c.noalias() = a * b; });
  return 2.0 * n * n * n / t / 1e9;
}

// The example's linear layers at batch 8 x 64 tokens: forward y = x W and backward dW += x^T dy,
// dx = dy W^T, for every linear of a block (qkv, attention proj, fc, mlp proj) and the head.
double example_gemm_gflops(int vocab, int reps) {
  const gpt::gpt_config c = model_config(vocab);
  const gpt::index tokens = batch_rows * c.seq_len;
  const std::pair<int, int> shapes[] = {
      {c.d_model, 3 * c.d_model}, {c.d_model, c.d_model}, {c.d_model, c.d_ff}, {c.d_ff, c.d_model}, {c.d_model, vocab}};
  double flops = 0;
  std::vector<gpt::mat<float>> xs, ws, dws, dys, ys(5), dxs(5);
  for (auto [in, out] : shapes) {
    xs.push_back(gpt::mat<float>::Random(tokens, in));
    ws.push_back(gpt::mat<float>::Random(in, out));
    dws.push_back(gpt::mat<float>::Zero(in, out));
    dys.push_back(gpt::mat<float>::Random(tokens, out));
    flops += 3.0 * 2.0 * double(tokens) * in * out;
  }
  const double t = best_seconds(reps, [&] {
    for (std::size_t k = 0; k < xs.size(); ++k) {
      gpt::layers::linear_forward<float>(xs[k], ws[k].data(), nullptr, ws[k].cols(), ys[k]);
      gpt::layers::linear_backward<float>(xs[k], dys[k], ws[k].data(), dws[k].data(), nullptr, dxs[k]);
    }
  });
  return flops / t / 1e9;
}

void print_row(const char* name, int ranks, double tps, const gpt::step_profile* p, double faults) {
  std::printf("%-10s %5d %10.0f", name, ranks, tps);
  if (p) {
    const double t = p->total;
    std::printf(" %8.1f %8.1f %8.1f %8.1f %9.2f", 100 * p->compute / t, 100 * p->engine() / t, 100 * p->comm / t,
                100 * p->optimizer_only() / t, 1e3 * p->total / double(p->steps));
  } else {
    std::printf(" %8s %8s %8s %8s %9s", "-", "-", "-", "-", "-");
  }
  if (faults >= 0)
    std::printf(" %11.1f\n", faults);
  else
    std::printf(" %11s\n", "-");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string_view(argv[1]) == "--quick";
  const int warmup = 3, steps = quick ? 5 : 15;
  const gpt::corpus data = gpt::corpus::synthetic(seed, 64);
  std::printf("the main job through zshard vs a plain loop of the same model; %d warm-up + %d measured steps%s\n",
              warmup, steps, quick ? " (--quick)" : "");
  std::printf("%-10s %5s %10s %8s %8s %8s %8s %9s %11s\n", "run", "ranks", "tok/s", "compute%", "engine%", "comm%",
              "optim%", "step_ms", "faults/step");
  const double plain = plain_tokens_per_s(data, warmup, steps);
  print_row("plain", 1, plain, nullptr, -1);
  std::vector<zshard_row> rows;
  for (int ranks : {1, 2, 4}) {
    rows.push_back(run_zshard(data, ranks, warmup, steps, true));
    print_row("zshard", ranks, rows.back().tokens_per_s, &rows.back().profile, rows.back().faults_per_step);
  }
  const zshard_row no_cache = run_zshard(data, 1, warmup, steps, false);
  print_row("no cache", 1, no_cache.tokens_per_s, &no_cache.profile, no_cache.faults_per_step);
  const double plain_again = plain_tokens_per_s(data, warmup, steps);  // load drift check
  print_row("plain", 1, plain_again, nullptr, -1);

  const double eigen = eigen_gemm_gflops(1024, quick ? 2 : 4);
  const double example = example_gemm_gflops(data.vocab(), quick ? 5 : 20);
  std::printf("\nGEMM GFLOP/s: Eigen 1024^3 %.1f, the example's linear layers %.1f\n", eigen, example);

  const gpt::step_profile& two = rows[1].profile;
  std::printf("\nexample_tokens_per_s_vs_plain: %.3f\n", rows[0].tokens_per_s / std::max(plain, plain_again));
  std::printf("step_engine_comm_share: %.3f\n", (two.engine() + two.comm) / two.total);
  std::printf("example_gemm_vs_eigen_peak: %.3f\n", example / eigen);
  std::printf("host_backend_page_faults_per_step: %.1f\n", rows[0].faults_per_step);
  std::printf("page_faults_per_step_without_cache: %.1f\n", no_cache.faults_per_step);
  std::printf("example_tokens_per_s_1_2_4: %.0f %.0f %.0f\n", rows[0].tokens_per_s, rows[1].tokens_per_s,
              rows[2].tokens_per_s);
  return 0;
}

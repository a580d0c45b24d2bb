#pragma once
// zshard_plan --fit --gpu host --calibrate-host: the host backend's rates, measured on this
// machine with `ranks` rank threads running at once (so that ranks sharing cores share them
// here too), for the time model (plan/fit_time_model.hpp):
//   gemm_tflops          Eigen's single-precision GEMM on the main job's linear layers (forward
//                        y = x W and both backward products), per rank thread
//   compute_efficiency   the main job's whole forward and backward (the plain model: layers,
//                        attention, loss) in FLOP/s, over that GEMM rate
//   host_adam_gelems     zshard's AdamW kernel (the widest vector path) over 1M elements, per rank
//   intra_node_gbps      thread_comm all_gather of 1 MiB blocks: bytes each rank sends per second
//   latency_us           thread_comm all_gather of one element: the time per collective
// Rates are work per wall-clock second over a window in which every rank thread works (the
// threads' share of the cores), the median over the threads; collective times are the median
// of single calls. bench/fit_calibration measures with this and compares the
// time model with the main job's measured steps.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gpt/corpus.hpp"
#include "gpt/gpt_model.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/optim/adamw_dispatch.hpp"
#include "zshard/plan/gpu_rates.hpp"

namespace zshard_tools {

struct host_measurement {
  int ranks = 1;
  double gemm_gflops = 0;   // per rank thread
  double model_gflops = 0;  // the main job's forward and backward, per rank thread
  double adam_gelems = 0;   // per rank thread
  double comm_gbps = 0;     // bytes sent per rank and second, all_gather of 1 MiB blocks
  double latency_us = 0;    // one all_gather of one element
};

namespace calibration_detail {

using clock = std::chrono::steady_clock;
inline double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Forward FLOPs per token of the GPT example (tools/fit_gpt_example.hpp's count, summed).
inline double gpt_forward_flops_per_token(const gpt::gpt_config& c) {
  const double d = c.d_model, f = c.d_ff, t = c.seq_len, v = c.vocab;
  return c.n_layers * (2 * (3 * d * d + d * d + 2 * d * f) + 2 * t * d) + 2 * d * v;
}

// Wall time per run of `once` over a window of `budget_s` (at least 3 runs). The rank threads
// run their windows at the same time, so where they share cores (with each other, or with
// other processes) each thread's figure is its share while the others run too: what a rank
// gets during a step.
template <class F>
double seconds_per_run(double budget_s, F&& once) {
  once();  // warm: allocations, caches
  int runs = 0;
  const auto start = clock::now();
  while (runs < 3 || seconds_since(start) < budget_s) {
    once();
    ++runs;
  }
  return seconds_since(start) / runs;
}

// The example's linear layers at `rows` tokens: forward and both backward products.
inline double gemm_gflops(const gpt::gpt_config& c, int rows, double budget_s) {
  const std::pair<int, int> shapes[] = {
      {c.d_model, 3 * c.d_model}, {c.d_model, c.d_model}, {c.d_model, c.d_ff}, {c.d_ff, c.d_model}, {c.d_model, c.vocab}};
  std::vector<gpt::mat<float>> xs, ws, dws, dys, ys(5), dxs(5);
  double flops = 0;
  for (auto [in, out] : shapes) {
    xs.push_back(gpt::mat<float>::Random(rows, in));
    ws.push_back(gpt::mat<float>::Random(in, out));
    dws.push_back(gpt::mat<float>::Zero(in, out));
    dys.push_back(gpt::mat<float>::Random(rows, out));
    flops += 3.0 * 2.0 * double(rows) * in * out;
  }
  return flops / seconds_per_run(budget_s, [&] {
           for (std::size_t k = 0; k < xs.size(); ++k) {
             gpt::layers::linear_forward<float>(xs[k], ws[k].data(), nullptr, ws[k].cols(), ys[k]);
             gpt::layers::linear_backward<float>(xs[k], dys[k], ws[k].data(), dws[k].data(), nullptr, dxs[k]);
           }
         }) / 1e9;
}

inline double model_gflops(const gpt::gpt_config& c, int batch, double budget_s) {
  gpt::plain_model<float> m(c, 1234);
  gpt::model_workspace<float> ws;
  const gpt::corpus data = gpt::corpus::synthetic(1234, c.vocab);
  const gpt::batch b = data.get_rows(0, 0, batch, c.seq_len);
  const double flops = 3.0 * gpt_forward_flops_per_token(c) * double(batch) * c.seq_len;
  return flops / seconds_per_run(budget_s, [&] {
           m.zero_grad();
           (void)gpt::forward_backward(m, b.tokens, b.targets, b.batch_size, b.seq_len, ws);
         }) / 1e9;
}

inline double adam_gelems(double budget_s) {
  const std::size_t n = std::size_t{1} << 20;
  std::vector<float> master(n, 0.1f), mom(n, 0.0f), var(n, 0.0f), grad(n, 0.01f);
  const zshard::optim::adamw_config cfg;
  const auto path = zshard::optim::best_path();
  int step = 0;
  return double(n) / seconds_per_run(budget_s, [&] {
           const auto s = zshard::optim::make_adamw_step(cfg, ++step, 1.0f, true);
           zshard::optim::adamw_update_on(path, s, master.data(), mom.data(), var.data(), grad.data(), n, nullptr,
                                          zshard::dtype::f32);
         }) / 1e9;
}

}  // namespace calibration_detail

// Measures the rates with `ranks` threads at once; `budget_s` per measurement and thread.
inline host_measurement measure_host(int ranks, const gpt::gpt_config& c, int batch = 8, double budget_s = 0.25) {
  namespace cd = calibration_detail;
  std::mutex mu;
  std::vector<double> gemm, model, adam, bw, lat;
  zshard::run_ranks(ranks, [&](zshard::thread_comm& comm) {
    comm.barrier();
    const double g = cd::gemm_gflops(c, batch * c.seq_len, budget_s);
    comm.barrier();
    const double m = cd::model_gflops(c, batch, budget_s);
    comm.barrier();
    const double a = cd::adam_gelems(budget_s);
    comm.barrier();
    // collectives: one element (latency), then 1 MiB blocks (bandwidth)
    std::vector<float> src(std::size_t{1} << 18, 1.0f), dst(src.size() * std::size_t(ranks));
    double l = 0, b = 0;
    if (ranks > 1) {  // every rank runs the same number of collectives: the loops stay in step
      std::vector<double> small(200), large(20);
      for (auto& t : small) {
        const auto t0 = cd::clock::now();
        comm.all_gather(src.data(), dst.data(), 1, zshard::dtype::f32);
        t = cd::seconds_since(t0);
      }
      comm.barrier();
      for (auto& t : large) {
        const auto t0 = cd::clock::now();
        comm.all_gather(src.data(), dst.data(), src.size(), zshard::dtype::f32);
        t = cd::seconds_since(t0);
      }
      l = cd::median(small);
      b = double(src.size() * sizeof(float)) * (ranks - 1) / std::max(cd::median(large) - l, 1e-9) / 1e9;
    }
    std::lock_guard lock(mu);
    gemm.push_back(g);
    model.push_back(m);
    adam.push_back(a);
    lat.push_back(l);
    bw.push_back(b);
  });
  return {ranks, cd::median(gemm), cd::median(model), cd::median(adam), cd::median(bw), cd::median(lat) * 1e6};
}

// The mean of two measurements (before and after a run: the machine's load drifts).
inline host_measurement mean_of(const host_measurement& a, const host_measurement& b) {
  return {a.ranks, 0.5 * (a.gemm_gflops + b.gemm_gflops), 0.5 * (a.model_gflops + b.model_gflops),
          0.5 * (a.adam_gelems + b.adam_gelems), 0.5 * (a.comm_gbps + b.comm_gbps), 0.5 * (a.latency_us + b.latency_us)};
}

// The `host` kind's rates with these measurements in place.
inline zshard::plan::gpu_rates host_rates(const host_measurement& h, zshard::plan::gpu_rates base) {
  base.gemm_tflops = h.gemm_gflops / 1e3;
  base.compute_efficiency = h.gemm_gflops > 0 ? h.model_gflops / h.gemm_gflops : 1.0;
  base.host_adam_gelems = h.adam_gelems;
  if (h.ranks > 1) {
    base.intra_node_gbps = h.comm_gbps;
    base.latency_us = h.latency_us;
  }
  return base;
}

}  // namespace zshard_tools

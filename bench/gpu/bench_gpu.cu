// bench_gpu: the CUDA backend and the NCCL communicator on this machine's GPUs, four questions
// measured in one run (GB = 1e9 bytes; kernel and collective times are the best of several
// repeats after a warm-up, timed with CUDA events):
//
//   1. kernels   How close do the backend's kernels come to a device-to-device copy?
//                GB/s = bytes read + written / t; "vs copy" = GB/s / copy GB/s.
//   2. nccl      all_gather (bf16) and reduce_scatter (f32, average) over every GPU of the
//                process: algbw = S / t (S = the full buffer), busbw = algbw * (n-1)/n, next to
//                a copy of S bytes. With one GPU NCCL only copies (busbw 0).
//   3. engine    One step of a GPT-2-small-shaped model (12 x 768, vocab 50304, bf16 working
//                copies) through zshard::engine on cuda_backend + nccl_comm, a synthetic compute
//                kernel standing in for each module's math: collectives that make the host wait
//                (nccl_completion::wait), stream-ordered ones (::enqueue) on one stream
//                (engine_config::overlap off), and with overlap on (gathers and reductions on
//                the role streams). Also the memory pool's reserved high-water mark next to the
//                ledger's peak: stream-ordered frees may hold memory a little past the ledger.
//                One overlap step is traced (engine_config::trace): the host time the engine
//                spends per phase (gathers, reductions, releases, the step's gradient sums,
//                the exchange, AdamW) beside the user's kernel launches, to attribute what the
//                step costs beyond its compute.
//   4. overlap   The same 12 blocks scheduled by hand on the role streams with two
//                communicators (gathers and reduce-scatters in flight together), vs the same
//                work serialised on one stream: the bound the engine's schedule is measured by.
//   5. gpt       The example GPT at GPT-2-small shape on one GPU, plain loop vs zshard, with and
//                without checkpointing (gpt_stage.hpp), beside PyTorch's run of the same GPT on the
//                same GPU when run.sh hands its output over (--torch-ref).
//
// Usage: bench_gpu [--quick] [--stages kernels,nccl,engine,overlap,gpt] (default: all)
//                  [--torch-ref FILE]... (bench/gpu/torch_reference.py's output, this run's)
// Without a CUDA device it says so and exits with 77 (run.sh fails when nvidia-smi sees a GPU).
// Key figures last as `name: value`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/backend/cuda_backend.hpp"
#include "zshard/comm/nccl_ranks.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/trace/trace_sink.hpp"
#include "engine_phases.hpp"
#include "gpt_stage.hpp"

namespace {

using zshard::cuda_backend;
using zshard::dtype;
using zshard::mem_category;
using stream = cuda_backend::stream;
using clock_type = std::chrono::steady_clock;
constexpr std::size_t mib = std::size_t{1} << 20;

// Keeps the whole GPU busy for about `ns`: the stand-in for a module's math.
__global__ void busy_kernel(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

void busy(const stream& s, int sms, double us) {
  busy_kernel<<<sms, 128, 0, s.handle()>>>(static_cast<unsigned long long>(us * 1000));
  ZSHARD_CUDA_CHECK(cudaGetLastError());
}

// Best time of `reps` runs of f on s, after one warm-up.
template <class F>
double best_ms(cuda_backend& b, const stream& s, int reps, F&& f) {
  f();
  b.synchronize(s);
  auto e0 = b.make_timing_event(), e1 = b.make_timing_event();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    b.record(e0, s);
    f();
    b.record(e1, s);
    b.synchronize(s);
    best = std::min(best, double(cuda_backend::elapsed_ms(e0, e1)));
  }
  return best;
}

double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

int sm_count(int device) {
  int n = 0;
  ZSHARD_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

// ---- 1. kernels ---------------------------------------------------------------------------------
struct kernel_figures {
  double adamw_vs_copy = 0, cast_vs_copy = 0, sum_squares_vs_copy = 0;
  double adamw_bf16_ms_per_mparam = 0;  // the AdamW kernel's own time per million parameters (bf16 working)
};

kernel_figures bench_kernels(bool quick) {
  cuda_backend b;
  const auto s = b.make_stream();
  const std::size_t n = (quick ? 16 : 64) * mib;  // elements: 4 f32 arrays of 256 MiB each, far beyond L2
  using buf = zshard::buffer<cuda_backend>;
  buf master(b, dtype::f32, n, mem_category::optimizer_state), m(b, dtype::f32, n, mem_category::optimizer_state),
      v(b, dtype::f32, n, mem_category::optimizer_state), grad(b, dtype::f32, n, mem_category::grad_shards),
      work(b, dtype::f32, n, mem_category::sharded_params), copy_src(b, dtype::f32, 4 * n, mem_category::scratch),
      copy_dst(b, dtype::f32, 4 * n, mem_category::scratch);
  for (buf* x : {&master, &m, &v, &grad, &work, &copy_src, &copy_dst})
    b.fill(x->data(), dtype::f32, x->numel(), 0.01f, s);
  const auto step = zshard::optim::make_adamw_step({}, 1, 1.0f, true);
  const int reps = quick ? 3 : 10;
  struct row {
    const char* name;
    double bytes_per_elem, ms;
  };
  std::vector<row> rows;
  const double copy_ms = best_ms(b, s, reps, [&] { b.copy(copy_dst.data(), copy_src.data(), copy_src.bytes(), s); });
  rows.push_back({"d2d copy (16 B/elem src)", 32, copy_ms});
  const auto adam = [&](void* out, dtype t) {
    b.adamw(step, master.as<float>(), m.as<float>(), v.as<float>(), grad.as<float>(), n, out, t, s);
  };
  rows.push_back({"adamw, no write-back", 28, best_ms(b, s, reps, [&] { adam(nullptr, dtype::f32); })});
  rows.push_back({"adamw + bf16 working", 30, best_ms(b, s, reps, [&] { adam(work.data(), dtype::bf16); })});
  rows.push_back({"adamw + f32 working", 32, best_ms(b, s, reps, [&] { adam(work.data(), dtype::f32); })});
  rows.push_back({"cast f32->bf16", 6, best_ms(b, s, reps, [&] {
                     b.convert(grad.data(), dtype::f32, work.data(), dtype::bf16, n, s);
                   })});
  rows.push_back({"add_into (grad accumulate)", 12, best_ms(b, s, reps, [&] {
                     b.add_into(grad.as<float>(), m.as<float>(), n, s);
                   })});
  const float* grad_ptr = grad.as<float>();
  const std::span<const float* const> one(&grad_ptr, 1);
  const std::span<const std::size_t> one_n(&n, 1);
  buf partial(b, dtype::f32, 2 * zshard::cuda::sum_squares_partials(one_n), mem_category::scratch),
      sum(b, dtype::f32, 2, mem_category::scratch);
  rows.push_back({"sum of squares (f64)", 4, best_ms(b, s, reps, [&] {
                     ZSHARD_CUDA_CHECK(zshard::cuda::sum_squares_batch(one, one_n, sum.as<double>(),
                                                                       partial.as<double>(), s.handle()));
                   })});
  const double copy_gbps = gbps(32.0 * double(n), copy_ms);
  std::printf("\n1. kernels, %zu Mi elements (f32 state)\n%-30s %10s %10s %10s %8s\n", n / mib, "kernel", "B/elem",
              "time_ms", "GB/s", "vs copy");
  kernel_figures out;
  for (const auto& r : rows) {
    const double g = gbps(r.bytes_per_elem * double(n), r.ms);
    std::printf("%-30s %10.0f %10.3f %10.1f %8.2f\n", r.name, r.bytes_per_elem, r.ms, g, g / copy_gbps);
    const std::string_view name = r.name;
    if (name == "adamw + bf16 working") out.adamw_vs_copy = g / copy_gbps, out.adamw_bf16_ms_per_mparam = r.ms / (double(n) / 1e6);
    if (name.starts_with("cast")) out.cast_vs_copy = g / copy_gbps;
    if (name.starts_with("sum of squares")) out.sum_squares_vs_copy = g / copy_gbps;
  }
  return out;
}

// ---- 2. nccl collectives --------------------------------------------------------------------------
struct coll_row {
  std::size_t bytes;
  const char* op;
  double ms, copy_ms;
};

std::vector<coll_row> bench_collectives(const std::vector<int>& devs, bool quick) {
  std::vector<coll_row> rows;
  std::mutex mu;
  const int w = static_cast<int>(devs.size());
  zshard::nccl_options opts;
  opts.completion = zshard::nccl_completion::enqueue;
  zshard::run_nccl_ranks(
      devs,
      [&](zshard::nccl_comm& c) {
        cuda_backend b({.device = c.device()});
        const auto s = b.make_stream();
        const auto cs = zshard::comm_stream::of(s);
        const std::vector<std::size_t> sizes =
            quick ? std::vector<std::size_t>{mib, 64 * mib}
                  : std::vector<std::size_t>{mib, 16 * mib, 64 * mib, 256 * mib};
        for (std::size_t bytes : sizes) {
          zshard::buffer<cuda_backend> full(b, dtype::f32, bytes / 4, mem_category::scratch),
              part(b, dtype::f32, bytes / 4, mem_category::scratch);
          b.fill_zero(full.data(), bytes, s);
          b.fill_zero(part.data(), bytes, s);
          const int reps = bytes >= 64 * mib ? 5 : 20;
          const std::size_t ag_count = bytes / 2 / std::size_t(w), rs_count = bytes / 4 / std::size_t(w);
          c.barrier(cs);
          const double ag =
              best_ms(b, s, reps, [&] { c.all_gather(part.data(), full.data(), ag_count, dtype::bf16, cs); });
          c.barrier(cs);
          const double rs = best_ms(b, s, reps, [&] {
            c.reduce_scatter(full.data(), part.data(), rs_count, dtype::f32, zshard::reduce_op::average, cs);
          });
          const double cp = best_ms(b, s, reps, [&] { b.copy(part.data(), full.data(), bytes, s); });
          if (c.rank() == 0) {
            std::lock_guard lock(mu);
            rows.push_back({bytes, "all_gather bf16", ag, cp});
            rows.push_back({bytes, "reduce_scatter f32 avg", rs, cp});
          }
        }
        c.synchronize();
      },
      opts);
  std::printf("\n2. nccl collectives, %d GPU(s); S = full buffer\n%8s %-24s %10s %11s %11s %11s\n", w, "S_MiB", "op",
              "time_ms", "algbw_GB/s", "busbw_GB/s", "copy_GB/s");
  for (const auto& r : rows) {
    const double alg = gbps(double(r.bytes), r.ms);
    std::printf("%8zu %-24s %10.3f %11.1f %11.1f %11.1f\n", r.bytes / mib, r.op, r.ms, alg, alg * (w - 1) / w,
                2 * gbps(double(r.bytes), r.copy_ms));
  }
  return rows;
}

// ---- 3. engine step on a GPT-2-small shape ---------------------------------------------------------
struct gpt_ids {
  zshard::module_id embed, head;
  std::vector<zshard::module_id> blocks;
};

zshard::model_spec gpt_spec(int layers, int d, int vocab, gpt_ids& id) {
  zshard::model_spec s;
  const auto w = [](float v) { return zshard::param_options{.init = zshard::init::constant(v)}; };
  const auto flat = [](float v) { return zshard::param_options{.decay = false, .init = zshard::init::constant(v)}; };
  const auto wte = s.add_param("wte", {vocab, d}, w(0.02f)), wpe = s.add_param("wpe", {1024, d}, w(0.01f));
  id.embed = s.add_module("embed", {wte, wpe});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    id.blocks.push_back(s.add_module(
        p + "block", {s.add_param(p + "ln1.g", {d}, flat(1)), s.add_param(p + "ln1.b", {d}, flat(0)),
                      s.add_param(p + "qkv.w", {d, 3 * d}, w(0.02f)), s.add_param(p + "qkv.b", {3 * d}, flat(0)),
                      s.add_param(p + "proj.w", {d, d}, w(0.02f)), s.add_param(p + "proj.b", {d}, flat(0)),
                      s.add_param(p + "ln2.g", {d}, flat(1)), s.add_param(p + "ln2.b", {d}, flat(0)),
                      s.add_param(p + "fc.w", {d, 4 * d}, w(0.02f)), s.add_param(p + "fc.b", {4 * d}, flat(0)),
                      s.add_param(p + "out.w", {4 * d, d}, w(0.02f)), s.add_param(p + "out.b", {d}, flat(0))}));
  }
  id.head = s.add_module("head", {s.add_param("lnf.g", {d}, flat(1)), s.add_param("lnf.b", {d}, flat(0)), wte});
  return s;
}

constexpr double fwd_us = 300, bwd_us = 600;  // synthetic compute per module (GPT-2 small, a few k tokens)

struct engine_result {
  double step_ms = 0;           // mean per step, rank 0
  double ledger_peak_gib = 0;   // the ledger's peak, rank 0
  double pool_high_gib = 0;     // the pool's reserved high-water mark, rank 0
};

// Mean ms per engine step on every GPU of the process.
// two_comms: reductions on a second communicator per rank (the engine's reduce_comm).
// trace: when given, the last timed step is recorded there (rank 0's events: trace->rank(0)).
engine_result bench_engine(const std::vector<int>& devs, zshard::nccl_completion mode, bool overlap, bool quick,
                           bool two_comms = false, zshard::trace_sink* trace = nullptr) {
  engine_result result;
  zshard::nccl_options reduce_opts;
  reduce_opts.completion = mode;
  std::vector<zshard::nccl_comm> reduce_comms;
  if (two_comms) reduce_comms = zshard::nccl_comm::create_local(devs, reduce_opts);
  try {
  zshard::run_nccl_ranks(devs, [&](zshard::nccl_comm& c) {
    cuda_backend b({.device = c.device()});
    const auto s = b.make_stream();  // the compute stream: the engine's, and the training stack's
    c.set_completion(mode);
    const int sms = sm_count(c.device());
    gpt_ids id;
    zshard::engine_config cfg;
    cfg.param_dtype = dtype::bf16;
    cfg.partition.persistence_threshold_numel = 4 * 768;  // biases and norm gains stay replicated
    cfg.reduce.reduce_bucket_numel = 25'000'000;
    cfg.prefetch.max_live_numel = 200'000'000;
    cfg.overlap = overlap;
    cfg.trace = trace;
    if (trace) trace->set_recording(false);
    {
      zshard::nccl_comm& rc = two_comms ? reduce_comms[static_cast<std::size_t>(c.rank())] : c;
      zshard::engine<cuda_backend, zshard::nccl_comm> eng(b, c, rc, gpt_spec(12, 768, 50304, id), cfg);
      const auto module_step = [&](zshard::module_id m, bool backward) {
        auto g = backward ? eng.backward(m) : eng.forward(m);
        busy(s, sms, backward ? bwd_us : fwd_us);
        if (backward)
          for (std::size_t k = 0; k < g.param_count(); ++k)
            b.fill(g.grad_data(k), dtype::f32, g.grad(k).numel(), 1e-4f, s);
      };
      const auto one_step = [&] {
        module_step(id.embed, false);
        for (auto m : id.blocks) module_step(m, false);
        module_step(id.head, false);
        eng.begin_backward();
        module_step(id.head, true);
        for (auto it = id.blocks.rbegin(); it != id.blocks.rend(); ++it) module_step(*it, true);
        module_step(id.embed, true);
        eng.end_backward();
        eng.step();
        b.synchronize_all();
      };
      for (int i = 0; i < 2; ++i) one_step();  // warm-up: the prefetcher records its trace, the pool fills
      const int steps = quick ? 2 : 5;
      const auto t0 = clock_type::now();
      for (int i = 0; i < steps; ++i) {
        const bool traced = trace && i == steps - 1;
        if (traced) {
          c.barrier();  // every rank between steps: the window is exactly one step
          if (c.rank() == 0) trace->set_recording(true);
        }
        one_step();
        if (traced && c.rank() == 0) trace->set_recording(false);
      }
      const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count() / steps;
      if (c.rank() == 0) {
        std::uint64_t high = 0;
        ZSHARD_CUDA_CHECK(cudaMemPoolGetAttribute(b.pool(), cudaMemPoolAttrReservedMemHigh, &high));
        result = {ms, double(b.ledger().total_peak()) / double(1ull << 30), double(high) / double(1ull << 30)};
      }
    }
    c.synchronize();
  });
  } catch (...) {
    for (auto& rc : reduce_comms) rc.abort("a rank of the engine bench failed");
    throw;
  }
  zshard::nccl_comm::finalize_all(reduce_comms);
  return result;
}

// ---- 4. overlap schedule on the role streams --------------------------------------------------------
// Returns {serial ms, overlapped ms} per fwd+bwd pass over `layers` blocks of `numel` parameters.
std::pair<double, double> bench_overlap(const std::vector<int>& devs, bool quick) {
  constexpr int layers = 12;
  constexpr std::size_t numel = 7'087'872;  // one GPT-2-small block
  const int w = static_cast<int>(devs.size());
  const std::size_t shard = (numel + std::size_t(w) - 1) / std::size_t(w), padded = shard * std::size_t(w);
  std::pair<double, double> result;
  zshard::nccl_options opts;
  opts.completion = zshard::nccl_completion::enqueue;
  // Two communicators per rank, so gathers and reduce-scatters can be in flight together.
  auto gather_comms = zshard::nccl_comm::create_local(devs, opts);
  zshard::run_nccl_ranks(devs, [&](zshard::nccl_comm& rc) {
    zshard::nccl_comm& gc = gather_comms[static_cast<std::size_t>(rc.rank())];
    cuda_backend b({.device = rc.device()});
    const int sms = sm_count(rc.device());
    const auto compute = b.make_stream(), gs = b.role_stream(zshard::stream_role::gather),
               rs = b.role_stream(zshard::stream_role::reduce);
    using buf = zshard::buffer<cuda_backend>;
    std::vector<buf> shards;
    for (int l = 0; l < layers; ++l) shards.emplace_back(b, dtype::bf16, shard, mem_category::sharded_params);
    buf gathered[2] = {buf(b, dtype::bf16, padded, mem_category::gathered_params),
                       buf(b, dtype::bf16, padded, mem_category::gathered_params)};
    buf grads[2] = {buf(b, dtype::f32, padded, mem_category::grad_buckets),
                    buf(b, dtype::f32, padded, mem_category::grad_buckets)};
    buf grad_shard(b, dtype::f32, shard, mem_category::grad_shards);
    for (auto* x : {&gathered[0], &gathered[1], &grads[0], &grads[1], &grad_shard})
      b.fill_zero(x->data(), x->bytes(), compute);
    for (auto& x : shards) b.fill_zero(x.data(), x.bytes(), compute);
    std::vector<cuda_backend::event> gathered_ev, used_ev, grad_ev, reduced_ev;
    for (int i = 0; i < 2 * layers; ++i) {
      gathered_ev.push_back(b.make_event());
      used_ev.push_back(b.make_event());
      grad_ev.push_back(b.make_event());
      reduced_ev.push_back(b.make_event());
    }
    b.synchronize(compute);
    const auto pass = [&](bool overlap) {
      const stream& g_stream = overlap ? gs : compute;
      const stream& r_stream = overlap ? rs : compute;
      const auto g_cs = zshard::comm_stream::of(g_stream), r_cs = zshard::comm_stream::of(r_stream);
      // Use u = 0..2L-1: forward blocks 0..L-1, then backward blocks L-1..0. Gather u+1 while u computes.
      const auto block_of = [&](int u) { return u < layers ? u : 2 * layers - 1 - u; };
      const auto gather = [&](int u) {
        if (u >= 2) b.wait(g_stream, used_ev[std::size_t(u - 2)]);  // its buffer's last reader is done
        gc.all_gather(shards[std::size_t(block_of(u))].data(), gathered[u % 2].data(), shard, dtype::bf16, g_cs);
        b.record(gathered_ev[std::size_t(u)], g_stream);
      };
      gather(0);
      for (int u = 0; u < 2 * layers; ++u) {
        if (u + 1 < 2 * layers && overlap) gather(u + 1);
        b.wait(compute, gathered_ev[std::size_t(u)]);
        const bool backward = u >= layers;
        if (backward && u >= layers + 2) b.wait(compute, reduced_ev[std::size_t(u - 2)]);  // grad buffer free
        busy(compute, sms, backward ? bwd_us : fwd_us);
        b.record(used_ev[std::size_t(u)], compute);
        if (backward) {
          b.record(grad_ev[std::size_t(u)], compute);
          b.wait(r_stream, grad_ev[std::size_t(u)]);
          rc.reduce_scatter(grads[u % 2].data(), grad_shard.data(), shard, dtype::f32, zshard::reduce_op::average,
                            r_cs);
          b.record(reduced_ev[std::size_t(u)], r_stream);
        }
        if (u + 1 < 2 * layers && !overlap) gather(u + 1);
      }
      b.wait(compute, reduced_ev[std::size_t(2 * layers - 1)]);
    };
    const int reps = quick ? 2 : 5;
    const double serial = best_ms(b, compute, reps, [&] { pass(false); });
    const double overlapped = best_ms(b, compute, reps, [&] { pass(true); });
    b.synchronize_all();
    if (rc.rank() == 0) result = {serial, overlapped};
  }, opts);
  zshard::nccl_comm::finalize_all(gather_comms);  // together: ranks may wait for each other
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string stages = "kernels,nccl,engine,overlap,gpt";
  std::vector<std::string> torch_refs;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--stages" && i + 1 < argc) stages = argv[++i];
    else if (a == "--torch-ref" && i + 1 < argc) torch_refs.emplace_back(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_gpu [--quick] [--stages kernels,nccl,engine,overlap,gpt] [--torch-ref FILE]...\n");
      return 2;
    }
  }
  const auto want = [&](std::string_view stage) { return ("," + stages + ",").find("," + std::string(stage) + ",") != std::string::npos; };
  const auto census = zshard::cuda::count_devices();
  if (census.count == 0) {
    std::printf("skipped: no CUDA device (%s); bench_gpu needs one (stages asked: %s)\n", census.reason.c_str(),
                stages.c_str());
    return 77;
  }
  try {
    std::vector<int> devs;
    for (int i = 0; i < std::min(census.count, 8); ++i) devs.push_back(i);
    cudaDeviceProp prop{};
    ZSHARD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int nccl_version = 0;
    (void)ncclGetVersion(&nccl_version);
    std::printf("bench_gpu: %d x %s (sm_%d%d, %d SMs), NCCL %d%s, stages %s\n", census.count, prop.name, prop.major,
                prop.minor, prop.multiProcessorCount, nccl_version, quick ? ", --quick" : "", stages.c_str());
    std::string figures;  // the closing `name: value` lines, in stage order
    const auto figure = [&](const char* name, double v, int digits = 2) {
      char line[128];
      std::snprintf(line, sizeof line, "%s: %.*f\n", name, digits, v);
      figures += line;
    };
    kernel_figures kf;
    if (want("kernels")) {
      kf = bench_kernels(quick);
      figure("adamw_vs_copy", kf.adamw_vs_copy);
      figure("cast_vs_copy", kf.cast_vs_copy);
      figure("sum_squares_vs_copy", kf.sum_squares_vs_copy);
    }
    if (want("nccl")) {
      const auto coll = bench_collectives(devs, quick);
      double ag_best = 0, rs_best = 0;
      for (const auto& r : coll) {
        const double bus = gbps(double(r.bytes), r.ms) * (double(devs.size()) - 1) / double(devs.size());
        const double alg = gbps(double(r.bytes), r.ms);
        double& best = std::string_view(r.op).starts_with("all_gather") ? ag_best : rs_best;
        best = std::max(best, devs.size() > 1 ? bus : alg);
      }
      figure(devs.size() > 1 ? "allgather_busbw_GBps" : "allgather_algbw_GBps", ag_best, 1);
      figure(devs.size() > 1 ? "reducescatter_busbw_GBps" : "reducescatter_algbw_GBps", rs_best, 1);
    }
    if (want("engine")) {
      const auto wait = bench_engine(devs, zshard::nccl_completion::wait, false, quick);
      const auto serial_step = bench_engine(devs, zshard::nccl_completion::enqueue, false, quick);
      zshard::trace_sink trace;
      const auto overlap_step = bench_engine(devs, zshard::nccl_completion::enqueue, true, quick, false, &trace);
      const auto two_comm_step = bench_engine(devs, zshard::nccl_completion::enqueue, true, quick, true);
      const double compute_ms = 14 * (fwd_us + bwd_us) / 1000;
      std::printf("\n3. engine step, GPT-2 small shape (124M params, bf16), %zu GPU(s), synthetic compute %.1f ms\n",
                  devs.size(), compute_ms);
      std::printf("%-48s %10s %12s %12s\n", "collectives", "ms/step", "ledger GiB", "pool GiB");
      const auto row = [](const char* name, const engine_result& r) {
        std::printf("%-48s %10.2f %12.3f %12.3f\n", name, r.step_ms, r.ledger_peak_gib, r.pool_high_gib);
      };
      row("wait, one stream (host waits on each)", wait);
      row("enqueue, one stream (overlap off)", serial_step);
      row("enqueue, role streams (overlap on)", overlap_step);
      row("enqueue, role streams, reductions on a 2nd comm", two_comm_step);
      const double engine_host_ms = print_phases(trace.rank(0), overlap_step.step_ms);
      // The AdamW kernel's own time for this model (124M parameters over the ranks, bf16 working).
      const double adamw_ms = kf.adamw_bf16_ms_per_mparam * 124.0 / double(devs.size());
      figure("engine_step_ms_wait", wait.step_ms);
      figure("engine_step_ms_serial", serial_step.step_ms);
      figure("engine_step_ms_overlap", overlap_step.step_ms);
      figure("engine_overlap_speedup", serial_step.step_ms / overlap_step.step_ms);
      figure("engine_step_ms_two_comms", two_comm_step.step_ms);
      figure("engine_two_comm_speedup", serial_step.step_ms / two_comm_step.step_ms);
      figure("engine_step_host_ms_in_engine", engine_host_ms);
      if (kf.adamw_bf16_ms_per_mparam > 0)
        figure("engine_step_vs_compute_plus_adamw", overlap_step.step_ms / (compute_ms + adamw_ms), 3);
      figure("engine_pool_vs_ledger", overlap_step.pool_high_gib / overlap_step.ledger_peak_gib, 3);
    }
    if (want("overlap")) {
      const auto [serial, overlapped] = bench_overlap(devs, quick);
      std::printf("\n4. 12 blocks fwd+bwd on the role streams (compute %.1f ms)\n%-44s %10.2f ms\n%-44s %10.2f ms\n",
                  12 * (fwd_us + bwd_us) / 1000, "serial (one stream)", serial, "overlapped (gather/reduce streams)",
                  overlapped);
      figure("hand_overlap_speedup", serial / overlapped);
    }
    if (want("gpt")) {
      const auto reference = gpt_stage::torch_reference::read(torch_refs);  // a bad file fails before the stage
      const auto gpt = gpt_stage::run(quick);
      gpt_stage::print_figures(gpt, reference, prop.name);
      std::fputs(figures.c_str(), stdout);
    } else {
      std::printf("\n");
      std::fputs(figures.c_str(), stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}

// comm_bandwidth: how fast do the thread and MPI communicators move a ZeRO-3 parameter
// (all_gather) and a gradient (reduce_scatter, average, f32), next to a plain memcpy of the
// same size measured in the same run? The MPI rows come from this program re-launched under
// mpiexec with 2 and 4 processes (--mpi-worker), one table for all.
//
// Definitions (GB = 1e9 bytes; times are the best of several repeats after a warm-up):
//   S        bytes of the full buffer on one rank: all_gather's output, reduce_scatter's input
//   algbw    S / t                     (NCCL's "algorithm bandwidth")
//   moved    n * S / t                 bytes read from source buffers by all n ranks together:
//                                      each rank reads S (every gathered block, or its block of
//                                      every rank's input)
//   memcpy   S / t_memcpy              one thread copying S bytes
//   ratio    moved / memcpy            > 1: the ranks together beat one copying thread
// Key figures: allgather_vs_memcpy = median over the thread all_gather rows of ratio (and
// the same for reduce_scatter, and for the MPI rows); mpi_vs_thread_allgather = median over
// sizes and rank counts of t_thread / t_mpi (> 1: MPI faster); mpi_allgather_vs_raw and
// mpi_reducescatter_vs_raw = the worst, over sizes 4 KiB - 64 MiB and rank counts, of
// t_raw / t_zshard, where t_raw is the better (lower median) of the MPI library's own blocking
// call (mpiraw rows) and its non-blocking call + MPI_Wait (mpi_nb rows) (< 1: zshard slower at
// that size), each a paired median over the interleaved rounds (the table's columns are best
// times; a second table prints the paired medians per size), over rank counts that fit the
// hardware threads (the *_oversubscribed figures: the others).
// mpi_p2p_allgather_vs_raw and mpi_allgather_vs_p2p: the same worst case for an all-gather of
// bare MPI_Isend/MPI_Irecv (mpip2p rows: zshard's data messages without its argument header)
// against the library, and for zshard against it (what the header costs).
// A second section (thread_latency.hpp) times small collectives: thread_allreduce_small_us.
//
// Usage: comm_bandwidth [--quick]      (--mpi-worker: internal, the MPI half under mpiexec)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "thread_latency.hpp"
#include "zshard/comm/thread_comm.hpp"
#ifdef ZSHARD_BENCH_MPI
#include "zshard/comm/mpi_run.hpp"
#endif

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::size_t mib = std::size_t{1} << 20;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

int repeats_for(std::size_t bytes, bool quick) {
  if (quick) return 3;
  return bytes <= 16 * mib ? 20 : bytes <= 64 * mib ? 8 : 5;
}

double best_memcpy_seconds(std::size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);  // touched: no page faults in the timed copies
  double best = std::numeric_limits<double>::infinity();
  for (int it = -1; it < reps; ++it) {
    const auto t0 = clock_type::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double t = seconds_since(t0);
    if (it >= 0) best = std::min(best, t);
    src[static_cast<std::size_t>(it + 1) % bytes] = dst[bytes / 2];  // keep the copy observable
  }
  return best;
}

enum class op_kind { all_gather, reduce_scatter };

// This rank's best time of `reps` runs of one collective of `count` elements per rank (after a
// warm-up run) on communicator c, with the buffers given.
template <class Comm>
double best_on_rank(Comm& c, op_kind op, std::size_t count, int reps, std::vector<float>& full,
                    std::vector<float>& shard) {
  double best = std::numeric_limits<double>::infinity();
  for (int it = -1; it < reps; ++it) {
    c.barrier();
    const auto t0 = clock_type::now();
    if (op == op_kind::all_gather)
      c.all_gather(shard.data(), full.data(), count, zshard::dtype::f32);
    else
      c.reduce_scatter(full.data(), shard.data(), count, zshard::dtype::f32, zshard::reduce_op::average);
    c.barrier();  // rank 0's clock stops once every rank is done
    if (it >= 0) best = std::min(best, seconds_since(t0));
  }
  return best;
}

// Best time of one collective over `ranks` thread ranks; S = `bytes` per rank.
double best_collective_seconds(op_kind op, int ranks, std::size_t bytes, int reps) {
  const std::size_t count = bytes / sizeof(float) / static_cast<std::size_t>(ranks);  // per-rank block
  double best = std::numeric_limits<double>::infinity();
  zshard::run_ranks(ranks, [&](zshard::thread_comm& c) {
    // Each rank allocates and touches its own buffers, as a rank thread would.
    std::vector<float> full(count * static_cast<std::size_t>(ranks), 1.0f + static_cast<float>(c.rank()));
    std::vector<float> shard(count, 0.5f);
    const double mine = best_on_rank(c, op, count, reps, full, shard);
    if (c.rank() == 0) best = mine;
  });
  return best;
}

// mpi_raw / mpi_raw_nb: the MPI library's own blocking / non-blocking collective; mpi_p2p: the
// direct messages zshard's all_gather sends for its data, without its argument header
enum class comm_kind { thread, mpi, mpi_raw, mpi_raw_nb, mpi_p2p };

struct row {
  std::size_t bytes;
  int ranks;
  op_kind op;
  double seconds;
  double memcpy_seconds;
  comm_kind comm = comm_kind::thread;
  // MPI rows: the time of each interleaved round (every kind once per round), for paired ratios
  std::vector<double> rounds = {};
  double ratio() const { return ranks * memcpy_seconds / seconds; }
};

std::vector<std::size_t> sizes_for(bool quick) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = mib; s <= (quick ? 16 : 256) * mib; s *= 4) sizes.push_back(s);
  return sizes;
}

#ifdef ZSHARD_BENCH_MPI
// The MPI rows: 4 KiB to 64 MiB, where a small collective's latency matters as much as a large
// one's bandwidth.
std::vector<std::size_t> mpi_sizes_for(bool quick) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = 4096; s <= 64 * mib; s *= quick ? 16 : 4) sizes.push_back(s);
  return sizes;
}

// Under mpiexec: rank 0 prints "row <bytes> <kind> <seconds> <memcpy seconds> <round seconds>..."
// per size and kind: the best time, then each round's. Kinds 0/1: zshard's all_gather /
// reduce_scatter; 2/3: the MPI library's blocking calls; 4/5: its non-blocking calls + MPI_Wait;
// 6: an all-gather of MPI_Isend/MPI_Irecv to and from every peer, the local block copied
// meanwhile: zshard's data messages without the header message that carries its arguments, so 6
// against 0 is what that check costs. Each time is one batch of back-to-back calls between two
// MPI_Barriers, divided by the batch: the engine issues collectives back to back, and a barrier
// per call would dwarf a 4 KiB one. All rows use the same barrier.
int mpi_worker(int argc, char** argv, bool quick) {
  return zshard::run_mpi(argc, argv, [&](zshard::mpi_comm& c) {
    const int ranks = c.size();
    const MPI_Comm h = c.handle();
    for (std::size_t bytes : mpi_sizes_for(quick)) {
      const std::size_t count = bytes / sizeof(float) / static_cast<std::size_t>(ranks);
      const int n = static_cast<int>(count);
      const int batch = static_cast<int>(std::clamp<std::size_t>(4 * mib / bytes, 1, 200));
      const int reps = quick ? 5 : 31;
      std::vector<float> full(count * static_cast<std::size_t>(ranks), 1.0f + static_cast<float>(c.rank()));
      std::vector<float> shard(count, 0.5f);
      const double t_memcpy = best_memcpy_seconds(bytes, reps);
      const auto wait = [](MPI_Request& r) { MPI_Wait(&r, MPI_STATUS_IGNORE); };
      std::vector<MPI_Request> p2p(2 * static_cast<std::size_t>(ranks), MPI_REQUEST_NULL);
      // MPI_Reduce_scatter_block reduces in MPI's order, not what zshard guarantees: a baseline only.
      constexpr int kinds = 7;
      const std::function<void()> calls[kinds] = {
          [&] { c.all_gather(shard.data(), full.data(), count, zshard::dtype::f32); },
          [&] { c.reduce_scatter(full.data(), shard.data(), count, zshard::dtype::f32, zshard::reduce_op::sum); },
          [&] { MPI_Allgather(shard.data(), n, MPI_FLOAT, full.data(), n, MPI_FLOAT, h); },
          [&] { MPI_Reduce_scatter_block(full.data(), shard.data(), n, MPI_FLOAT, MPI_SUM, h); },
          [&] {
            MPI_Request r;
            MPI_Iallgather(shard.data(), n, MPI_FLOAT, full.data(), n, MPI_FLOAT, h, &r);
            wait(r);
          },
          [&] {
            MPI_Request r;
            MPI_Ireduce_scatter_block(full.data(), shard.data(), n, MPI_FLOAT, MPI_SUM, h, &r);
            wait(r);
          },
          [&] {
            const int me = c.rank();
            for (int q = 0; q < ranks; ++q)
              if (q != me) MPI_Irecv(full.data() + q * count, n, MPI_FLOAT, q, 0, h, &p2p[2 * std::size_t(q)]);
            for (int q = 0; q < ranks; ++q)
              if (q != me) MPI_Isend(shard.data(), n, MPI_FLOAT, q, 0, h, &p2p[2 * std::size_t(q) + 1]);
            std::memcpy(full.data() + me * count, shard.data(), count * sizeof(float));
            MPI_Waitall(static_cast<int>(p2p.size()), p2p.data(), MPI_STATUSES_IGNORE);
          }};
      // Interleaved: each round times every kind once, so a busy spell of a shared machine
      // falls on all of them rather than on one kind's every repeat; in a new order each round
      // (a fixed-seed shuffle, the same on every rank), so no kind always runs after the same
      // other one (host_adam measured what a fixed predecessor does to a cache-sized buffer).
      double t[kinds];
      std::fill(std::begin(t), std::end(t), std::numeric_limits<double>::infinity());
      std::vector<double> round_times[kinds];
      int order[kinds];
      std::iota(std::begin(order), std::end(order), 0);
      std::mt19937 shuffle_rng(static_cast<unsigned>(bytes));
      for (int it = -1; it < reps; ++it) {
        std::shuffle(std::begin(order), std::end(order), shuffle_rng);
        for (int k : order) {
          MPI_Barrier(h);
          const auto t0 = clock_type::now();
          for (int b = 0; b < batch; ++b) calls[k]();
          MPI_Barrier(h);
          const double per_call = seconds_since(t0) / batch;
          if (it >= 0) t[k] = std::min(t[k], per_call), round_times[k].push_back(per_call);
        }
      }
      if (c.rank() == 0)
        for (int k = 0; k < kinds; ++k) {
          std::printf("row %zu %d %.9f %.9f", bytes, k, t[k], t_memcpy);
          for (double r : round_times[k]) std::printf(" %.9f", r);
          std::printf("\n");
        }
    }
    std::fflush(stdout);
  });
}

// Re-launches this program under mpiexec with `ranks` processes and reads its rows.
std::vector<row> mpi_rows(int ranks, bool quick) {
  char self[4096] = {};
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return {};
  if (geteuid() == 0) {  // Open MPI refuses root unless told (containers); harmless elsewhere
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  const std::string cmd = std::string(ZSHARD_BENCH_MPIEXEC) + " -n " + std::to_string(ranks) + " " +
                          ZSHARD_BENCH_MPIEXEC_FLAGS + " " + self + " --mpi-worker" + (quick ? " --quick" : "");
  std::vector<row> rows;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return rows;
  char line[4096];
  constexpr comm_kind kinds[] = {comm_kind::mpi, comm_kind::mpi_raw, comm_kind::mpi_raw_nb, comm_kind::mpi_p2p};
  while (std::fgets(line, sizeof line, p)) {
    std::size_t bytes = 0;
    int kind = 0;
    double secs = 0, t_memcpy = 0;
    int used = 0;
    if (std::sscanf(line, "row %zu %d %lf %lf%n", &bytes, &kind, &secs, &t_memcpy, &used) != 4 || kind < 0 || kind > 6)
      continue;
    std::vector<double> rounds;
    double r = 0;
    for (int more = 0; std::sscanf(line + used, "%lf%n", &r, &more) == 1; used += more) rounds.push_back(r);
    rows.push_back({bytes, ranks, kind % 2 == 0 ? op_kind::all_gather : op_kind::reduce_scatter, secs, t_memcpy,
                    kinds[kind / 2], std::move(rounds)});
  }
  if (pclose(p) != 0) std::fprintf(stderr, "comm_bandwidth: '%s' failed\n", cmd.c_str());
  return rows;
}
#endif

void print_row(const row& r) {
  const double s = static_cast<double>(r.bytes);
  constexpr const char* names[] = {"thread", "mpi", "mpiraw", "mpi_nb", "mpip2p"};
  std::printf("%8.3f %-6s %5d %-15s %10.3f %12.2f %12.2f %12.2f %7.2f\n", static_cast<double>(r.bytes) / mib,
              names[static_cast<int>(r.comm)], r.ranks, r.op == op_kind::all_gather ? "all_gather" : "reduce_scatter",
              r.seconds * 1e6, s / r.seconds / 1e9, r.ranks * s / r.seconds / 1e9, s / r.memcpy_seconds / 1e9,
              r.ratio());
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, worker = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::string_view(argv[i]) == "--quick";
    worker = worker || std::string_view(argv[i]) == "--mpi-worker";
  }
#ifdef ZSHARD_BENCH_MPI
  if (worker) return mpi_worker(argc, argv, quick);
#else
  if (worker) return 2;
#endif
  const std::vector<std::size_t> sizes = sizes_for(quick);
  const int rank_counts[] = {2, 4};

  std::printf("thread and MPI communicators vs memcpy, f32, %u hardware threads%s\n",
              std::thread::hardware_concurrency(), quick ? " (--quick)" : "");
  std::printf(
      "S = full buffer per rank; algbw = S/t; moved = ranks*S/t; memcpy = S/t_memcpy (1 thread); "
      "ratio = moved/memcpy; GB = 1e9 B\n\n");
  std::printf("%8s %-6s %5s %-15s %10s %12s %12s %12s %7s\n", "S_MiB", "comm", "ranks", "op", "time_us", "algbw_GB/s",
              "moved_GB/s", "memcpy_GB/s", "ratio");

  std::vector<row> rows;
  for (std::size_t bytes : sizes) {
    const int reps = repeats_for(bytes, quick);
    const double t_memcpy = best_memcpy_seconds(bytes, reps);
    for (int ranks : rank_counts) {
      for (op_kind op : {op_kind::all_gather, op_kind::reduce_scatter}) {
        rows.push_back({bytes, ranks, op, best_collective_seconds(op, ranks, bytes, reps), t_memcpy});
        print_row(rows.back());
      }
    }
  }
#ifdef ZSHARD_BENCH_MPI
  for (int ranks : rank_counts)
    for (const row& r : mpi_rows(ranks, quick)) {
      rows.push_back(r);
      print_row(r);
    }
#else
  std::printf("(no MPI rows: built without MPI)\n");
#endif

  auto collect = [&](comm_kind comm, op_kind op, int ranks, bool ratio) {
    std::vector<double> v;
    for (const row& r : rows)
      if (r.comm == comm && r.op == op && (ranks == 0 || r.ranks == ranks))
        v.push_back(ratio ? r.ratio() : static_cast<double>(r.bytes) / r.seconds / 1e9);
    return median(v);
  };
  // median over matching (size, ranks) rows of t_base / t_mpi
  auto speedup = [&](comm_kind base, op_kind op) {
    std::vector<double> v;
    for (const row& r : rows)
      if (r.comm == comm_kind::mpi && r.op == op)
        for (const row& t : rows)
          if (t.comm == base && t.op == op && t.ranks == r.ranks && t.bytes == r.bytes)
            v.push_back(t.seconds / r.seconds);
    return median(v);
  };
  // worst over (size, ranks) of t_raw / t_mpi, t_raw the better of MPI's blocking and
  // non-blocking call at that size (< 1: zshard slower than the library at its best), as a
  // paired median: per round, the better call's time in that round over ours in it, the median
  // over rounds. (A ratio of best times compares each call's luckiest round: at 16 MiB, where
  // the buffers outgrow the last-level cache, identical message sequences differed by 20 % that
  // way on a 2-core EPYC; bench/NOTES_issue27.md.)
  // Rows with more processes than hardware threads measure the scheduler more than either
  // implementation: they get a figure of their own.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // (`of`: whose time is divided into the library's; `against`: the library's calls compared)
  // The paired median of row r against the better of `against` at its size and rank count: the
  // call with the lower median time, not the faster of them round by round (the smaller of two
  // noisy times is biased low: MPI's own blocking call scored 0.86 against it, standalone).
  auto paired_vs = [&](const row& r, std::initializer_list<comm_kind> against) {
    const row* better = nullptr;
    for (const row& t : rows)
      if (std::find(against.begin(), against.end(), t.comm) != against.end() && t.op == r.op && t.ranks == r.ranks &&
          t.bytes == r.bytes && (!better || median(t.rounds) < median(better->rounds)))
        better = &t;
    std::vector<double> paired;
    for (std::size_t i = 0; better && i < r.rounds.size() && i < better->rounds.size(); ++i)
      paired.push_back(better->rounds[i] / r.rounds[i]);
    return paired.empty() ? std::numeric_limits<double>::quiet_NaN() : median(paired);
  };
  auto worst_vs = [&](comm_kind of, std::initializer_list<comm_kind> against, op_kind op, bool oversubscribed) {
    double worst = std::numeric_limits<double>::infinity();
    for (const row& r : rows)
      if (r.comm == of && r.op == op && (r.ranks > cores) == oversubscribed) {
        const double v = paired_vs(r, against);
        if (!std::isnan(v)) worst = std::min(worst, v);
      }
    return std::isfinite(worst) ? worst : 0.0;
  };
#ifdef ZSHARD_BENCH_MPI
  // Per size, where the worst cases above come from.
  std::printf("\nzshard's MPI collectives against the library's better call (paired medians; < 1: zshard slower)\n");
  std::printf("%8s %5s %11s %15s %13s\n", "S_MiB", "ranks", "all_gather", "reduce_scatter", "p2p_gather");
  for (const row& r : rows)
    if (r.comm == comm_kind::mpi && r.op == op_kind::all_gather)
      for (const row& rs : rows)
        if (rs.comm == comm_kind::mpi && rs.op == op_kind::reduce_scatter && rs.bytes == r.bytes && rs.ranks == r.ranks)
          for (const row& p : rows)
            if (p.comm == comm_kind::mpi_p2p && p.bytes == r.bytes && p.ranks == r.ranks)
              std::printf("%8.3f %5d %11.2f %15.2f %13.2f\n", static_cast<double>(r.bytes) / mib, r.ranks,
                          paired_vs(r, {comm_kind::mpi_raw, comm_kind::mpi_raw_nb}),
                          paired_vs(rs, {comm_kind::mpi_raw, comm_kind::mpi_raw_nb}),
                          paired_vs(p, {comm_kind::mpi_raw, comm_kind::mpi_raw_nb}));
#endif
  auto worst_vs_raw = [&](op_kind op, bool oversubscribed) {
    return worst_vs(comm_kind::mpi, {comm_kind::mpi_raw, comm_kind::mpi_raw_nb}, op, oversubscribed);
  };
  std::vector<double> memcpy_rates;
  for (const row& r : rows)
    if (r.comm == comm_kind::thread) memcpy_rates.push_back(static_cast<double>(r.bytes) / r.memcpy_seconds / 1e9);
  const auto th = comm_kind::thread, mp = comm_kind::mpi;

  const double small_us = thread_latency::print_small_collectives(quick);

  std::printf("\n");
  std::printf("thread_allreduce_small_us: %.2f\n", small_us);
  std::printf("memcpy_gbps: %.2f\n", median(memcpy_rates));
  std::printf("allgather_algbw_gbps_2ranks: %.2f\n", collect(th, op_kind::all_gather, 2, false));
  std::printf("allgather_algbw_gbps_4ranks: %.2f\n", collect(th, op_kind::all_gather, 4, false));
  std::printf("reducescatter_algbw_gbps_2ranks: %.2f\n", collect(th, op_kind::reduce_scatter, 2, false));
  std::printf("reducescatter_algbw_gbps_4ranks: %.2f\n", collect(th, op_kind::reduce_scatter, 4, false));
  std::printf("reducescatter_vs_memcpy: %.2f\n", collect(th, op_kind::reduce_scatter, 0, true));
  std::printf("allgather_vs_memcpy: %.2f\n", collect(th, op_kind::all_gather, 0, true));
#ifdef ZSHARD_BENCH_MPI
  std::printf("mpi_allgather_vs_raw: %.2f\n", worst_vs_raw(op_kind::all_gather, false));
  std::printf("mpi_reducescatter_vs_raw: %.2f\n", worst_vs_raw(op_kind::reduce_scatter, false));
  std::printf("mpi_allgather_vs_raw_oversubscribed: %.2f\n", worst_vs_raw(op_kind::all_gather, true));
  std::printf("mpi_reducescatter_vs_raw_oversubscribed: %.2f\n", worst_vs_raw(op_kind::reduce_scatter, true));
  // The header message's share: the same data messages without it, against the library and against zshard.
  std::printf("mpi_p2p_allgather_vs_raw: %.2f\n",
              worst_vs(comm_kind::mpi_p2p, {comm_kind::mpi_raw, comm_kind::mpi_raw_nb}, op_kind::all_gather, false));
  std::printf("mpi_allgather_vs_p2p: %.2f\n",
              worst_vs(comm_kind::mpi, {comm_kind::mpi_p2p}, op_kind::all_gather, false));
  std::printf("mpi_allgather_vs_memcpy: %.2f\n", collect(mp, op_kind::all_gather, 0, true));
  std::printf("mpi_reducescatter_vs_memcpy: %.2f\n", collect(mp, op_kind::reduce_scatter, 0, true));
  std::printf("mpi_vs_thread_allgather: %.2f\n", speedup(comm_kind::thread, op_kind::all_gather));
#else
  (void)mp;
#endif
  return 0;
}

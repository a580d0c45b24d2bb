// comm_bandwidth: how fast does the thread communicator move a ZeRO-3 parameter (all_gather)
// and a gradient (reduce_scatter, average, f32), next to a plain memcpy of the same size
// measured in the same run?
//
// Definitions (GB = 1e9 bytes; times are the best of several repeats after a warm-up):
//   S        bytes of the full buffer on one rank: all_gather's output, reduce_scatter's input
//   algbw    S / t                     (NCCL's "algorithm bandwidth")
//   moved    n * S / t                 bytes read from source buffers by all n ranks together:
//                                      each rank reads S (every gathered block, or its block of
//                                      every rank's input)
//   memcpy   S / t_memcpy              one thread copying S bytes
//   ratio    moved / memcpy            > 1: the ranks together beat one copying thread
// Key figure allgather_vs_memcpy = median over all all_gather rows of ratio.
// A second section (thread_latency.hpp) times small collectives: thread_allreduce_small_us.
//
// Usage: comm_bandwidth [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <thread>
#include <vector>

#include "thread_latency.hpp"
#include "zshard/comm/thread_comm.hpp"

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

// Best time of one collective over `ranks` thread ranks; S = `bytes` per rank.
double best_collective_seconds(op_kind op, int ranks, std::size_t bytes, int reps) {
  const std::size_t count = bytes / sizeof(float) / static_cast<std::size_t>(ranks);  // per-rank block
  double best = std::numeric_limits<double>::infinity();
  zshard::run_ranks(ranks, [&](zshard::thread_comm& c) {
    // Each rank allocates and touches its own buffers, as a rank thread would.
    std::vector<float> full(count * static_cast<std::size_t>(ranks), 1.0f + static_cast<float>(c.rank()));
    std::vector<float> shard(count, 0.5f);
    for (int it = -1; it < reps; ++it) {
      c.barrier();
      const auto t0 = clock_type::now();
      if (op == op_kind::all_gather)
        c.all_gather(shard.data(), full.data(), count, zshard::dtype::f32);
      else
        c.reduce_scatter(full.data(), shard.data(), count, zshard::dtype::f32, zshard::reduce_op::average);
      c.barrier();  // rank 0's clock stops once every rank is done
      if (c.rank() == 0 && it >= 0) best = std::min(best, seconds_since(t0));
    }
  });
  return best;
}

struct row {
  std::size_t bytes;
  int ranks;
  op_kind op;
  double seconds;
  double memcpy_seconds;
  double ratio() const { return ranks * memcpy_seconds / seconds; }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string_view(argv[1]) == "--quick";
  std::vector<std::size_t> sizes;
  for (std::size_t s = mib; s <= (quick ? 16 : 256) * mib; s *= 4) sizes.push_back(s);
  const int rank_counts[] = {2, 4};

  std::printf("thread communicator vs memcpy, f32, %u hardware threads%s\n", std::thread::hardware_concurrency(),
              quick ? " (--quick)" : "");
  std::printf(
      "S = full buffer per rank; algbw = S/t; moved = ranks*S/t; memcpy = S/t_memcpy (1 thread); "
      "ratio = moved/memcpy; GB = 1e9 B\n\n");
  std::printf("%8s %5s %-15s %10s %12s %12s %12s %7s\n", "S_MiB", "ranks", "op", "time_ms", "algbw_GB/s", "moved_GB/s",
              "memcpy_GB/s", "ratio");

  std::vector<row> rows;
  for (std::size_t bytes : sizes) {
    const int reps = repeats_for(bytes, quick);
    const double t_memcpy = best_memcpy_seconds(bytes, reps);
    for (int ranks : rank_counts) {
      for (op_kind op : {op_kind::all_gather, op_kind::reduce_scatter}) {
        const row r{bytes, ranks, op, best_collective_seconds(op, ranks, bytes, reps), t_memcpy};
        rows.push_back(r);
        const double s = static_cast<double>(bytes);
        std::printf("%8zu %5d %-15s %10.3f %12.2f %12.2f %12.2f %7.2f\n", bytes / mib, ranks,
                    op == op_kind::all_gather ? "all_gather" : "reduce_scatter", r.seconds * 1e3, s / r.seconds / 1e9,
                    ranks * s / r.seconds / 1e9, s / t_memcpy / 1e9, r.ratio());
        std::fflush(stdout);
      }
    }
  }

  auto collect = [&](op_kind op, int ranks, bool ratio) {
    std::vector<double> v;
    for (const row& r : rows)
      if (r.op == op && (ranks == 0 || r.ranks == ranks))
        v.push_back(ratio ? r.ratio() : static_cast<double>(r.bytes) / r.seconds / 1e9);
    return median(v);
  };
  std::vector<double> memcpy_rates;
  for (const row& r : rows) memcpy_rates.push_back(static_cast<double>(r.bytes) / r.memcpy_seconds / 1e9);

  const double small_us = thread_latency::print_small_collectives(quick);

  std::printf("\n");
  std::printf("thread_allreduce_small_us: %.2f\n", small_us);
  std::printf("memcpy_gbps: %.2f\n", median(memcpy_rates));
  std::printf("allgather_algbw_gbps_2ranks: %.2f\n", collect(op_kind::all_gather, 2, false));
  std::printf("allgather_algbw_gbps_4ranks: %.2f\n", collect(op_kind::all_gather, 4, false));
  std::printf("reducescatter_algbw_gbps_2ranks: %.2f\n", collect(op_kind::reduce_scatter, 2, false));
  std::printf("reducescatter_algbw_gbps_4ranks: %.2f\n", collect(op_kind::reduce_scatter, 4, false));
  std::printf("reducescatter_vs_memcpy: %.2f\n", collect(op_kind::reduce_scatter, 0, true));
  std::printf("allgather_vs_memcpy: %.2f\n", collect(op_kind::all_gather, 0, true));
  return 0;
}

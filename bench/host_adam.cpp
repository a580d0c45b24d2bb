// host_adam: how close does the host AdamW come to this machine's memory bandwidth, with and
// without its fused bf16 write-back, and how does it compare with a DeepSpeed-style kernel?
//
// Every kernel runs over n parameters with 1 and 2 threads (the persistent worker pool, tiles
// of 64K elements), in one run; times are the best of several interleaved rounds after a warm-up.
//   adam_f32  AdamW alone, the widest path this CPU runs: reads p, g, m, v; writes p, m, v
//             = 28 bytes/param; with this process's prefetch setting (adamw_prefetch.hpp:
//             ZSHARD_ADAMW_PREFETCH, else by CPU vendor: 2 KiB on Intel, off elsewhere)
//   f32_pf0   the same kernel with the software prefetch off     } AVX-512 CPUs only: every
//   f32_pf2k  the same with 2 KiB, what it had on every CPU before } choice side by side
//   ceil_f32  moves exactly those 28 bytes with no arithmetic (loads p, g, m, v; stores p, m, v
//             unchanged), same vector width, tiles and threads: the f32 limit
//   ceil_div  ceil_f32 plus one IEEE square root and one division per element (AVX-512 CPUs):
//             the bytes and the divider work every exact AdamW needs; in cache on CPUs with a
//             slow 512-bit divider this, not memory, is the limit
//   ref_f32   reference_adam.hpp: a DeepSpeed-style AVX-512 kernel (8 vectors per iteration,
//             FMAs, one division per vector), the same formula, 28 bytes/param
//   fused     AdamW + bf16 copy in one pass (what host_adam uses): 30 bytes/param
//   ceiling   the fused kernel's 30 bytes with no arithmetic (the top half of g stored as the
//             "bf16" copy): the bf16 limit. The bf16 store itself costs (its line is read
//             before it is written), so this limit sits below ceil_f32 in GB/s.
//   ref_bf16  the reference kernel with its bf16 copy in the same pass: 30 bytes/param
//   unfused   adam_f32, then a separate vectorised cast pass (reads p, writes bf16) = 34
//   scalar    adamw_update_scalar (the reference loop) with the bf16 copy = 30 bytes/param
//   triad     STREAM triad a = b + s * c, 12 bytes/element counted as STREAM counts them.
// GB/s = bytes/param as listed x n / time (GB = 1e9 bytes); Mparams/s = n / time / 1e6;
// vs_ceiling = GB/s / the GB/s of the ceiling with the same bytes (28: ceil_f32, else ceiling)
// at the same n and threads.
//
// Key figures (after cpu_model: /proc/cpuinfo's model name), each the worst (minimum) over all
// (n, threads) configurations of a paired median: per round, the one kernel's time over the
// other's in that same round, the median over rounds (the table's columns are best times; a
// ratio of two best times compares each kernel's luckiest run, and on a shared machine two runs
// of the same kernel differed by up to 10 % that way):
//   adam_vs_f32_ceiling       ceil_f32 time / adam_f32 time          (target >= 0.95)
//   adam_vs_divider_ceiling   ceil_div time / adam_f32 time          (what is left where the
//                             divider, not memory, bounds every exact kernel)
//   adam_vs_bf16_ceiling      ceiling time / fused time              (was adam_vs_ceiling)
//   pf0_vs_f32_ceiling        ceil_f32 time / f32_pf0 time           (prefetch off)
//   pf2k_vs_f32_ceiling       ceil_f32 time / f32_pf2k time          (before: 2 KiB everywhere)
//   adam_vs_deepspeed         ref time / ours, f32 and bf16 alike    (target >= 1.0; was
//                             adam_vs_reference_kernel)
//   fused_vs_unfused          unfused time / fused time              (34 vs 30 bytes)
//   adam_vs_scalar            scalar time / fused time
//   adam_same_kernel_spread   adam_f32 against its twin (f32_pf2k or f32_pf0, whichever has this
//                             process's prefetch distance: the same code, pool and tiles), the
//                             worse way round: the noise floor of every ratio above. A figure
//                             that misses its target by less than 1 - this spread is a tie.
//
// Sizes: 512K parameters (14 MB of state: in the last-level cache of current servers), 8M
// (224 MB) and 128M (3.6 GB: memory-bound everywhere). The CPU model (/proc/cpuinfo) is printed
// above the table, since every figure is a property of that CPU.
//
// Usage: host_adam [--quick]     (--quick: 512K and 8M parameters only, fewer repeats)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "reference_adam.hpp"
#include "zshard/optim/adamw_dispatch.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace {

using namespace zshard;
using clock_type = std::chrono::steady_clock;

// 64-byte aligned, touched (no page faults in the timed runs), freed on scope exit.
template <class T>
struct aligned_array {
  T* data = nullptr;
  explicit aligned_array(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    data = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data) {
      std::fprintf(stderr, "host_adam: cannot allocate %zu bytes\n", bytes);
      std::exit(1);
    }
    std::memset(static_cast<void*>(data), 0, bytes);
  }
  aligned_array(const aligned_array&) = delete;
  aligned_array& operator=(const aligned_array&) = delete;
  ~aligned_array() { std::free(data); }
};

// Deterministic values in [lo, hi) from a 64-bit mix of the index: fast and reproducible.
void fill(float* x, std::size_t n, float lo, float hi, std::uint64_t seed) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 29;
    x[i] = lo + (hi - lo) * static_cast<float>(z >> 40) * 0x1p-24f;
  }
}

// ---- the memory ceiling: the fused kernel's loads and stores, no arithmetic -------------------
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12 flags the placeholder inside _mm512_undefined_epi32() (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512 opaque512(__m512 x) {
  // The compiler cannot see that the value is stored back unchanged. volatile: the statement is
  // kept even where its result is unused (the f32 ceiling loads g and stores nothing from it);
  // without it g's load was deleted and that "28-byte" ceiling moved 24 bytes.
  __asm__ volatile("" : "+v"(x));
  return x;
}
// out null: the f32 ceiling (28 bytes), g is loaded and kept opaque but nothing is stored from it.
// Divider (ceil_div, f32 only): the divider's share of exact AdamW as well, one IEEE square root
// and one division per element on the loaded values (results kept opaque, nothing stored from
// them: the arrays stay as they are for the other kernels). Where the divider rather than memory
// is the limit (in cache on AMD Zen 4: 10 + 6 cycles for a 512-bit square root and division, 16
// for 16 elements, bench/NOTES_issue27.md), no kernel that rounds both like IEEE, zshard's or
// DeepSpeed's, can beat it.
template <bool Divider = false>
__attribute__((target("avx512f,avx512bw"))) void same_bytes_avx512(float* p, const float* g, float* m, float* v,
                                                                   std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = opaque512(_mm512_loadu_ps(p + i)), c = opaque512(_mm512_loadu_ps(m + i));
    const __m512 d = opaque512(_mm512_loadu_ps(v + i));
    const __m512 e = opaque512(_mm512_loadu_ps(g + i));
    if constexpr (Divider) opaque512(_mm512_div_ps(c, _mm512_add_ps(_mm512_sqrt_ps(d), _mm512_set1_ps(1e-8f))));
    _mm512_storeu_ps(m + i, c);
    _mm512_storeu_ps(v + i, d);
    _mm512_storeu_ps(p + i, a);
    if (out)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(e), 16)));
  }
  if (!out) return;
  for (; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, g + i, 4);
    out[i] = static_cast<std::uint16_t>(u >> 16);
  }
}
__attribute__((target("avx2"), always_inline)) inline __m256 opaque256(__m256 x) {
  __asm__ volatile("" : "+x"(x));  // volatile: see opaque512
  return x;
}
__attribute__((target("avx2"))) void same_bytes_avx2(float* p, const float* g, float* m, float* v, std::uint16_t* out,
                                                     std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = opaque256(_mm256_loadu_ps(p + i)), c = opaque256(_mm256_loadu_ps(m + i));
    const __m256 d = opaque256(_mm256_loadu_ps(v + i));
    const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(opaque256(_mm256_loadu_ps(g + i))), 16);
    _mm256_storeu_ps(m + i, c);
    _mm256_storeu_ps(v + i, d);
    _mm256_storeu_ps(p + i, a);
    if (out)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
  }
  if (!out) return;
  for (; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, g + i, 4);
    out[i] = static_cast<std::uint16_t>(u >> 16);
  }
}
#endif

void same_bytes(optim::simd_path path, float* p, const float* g, float* m, float* v, std::uint16_t* out,
                std::size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (path == optim::simd_path::avx512 || path == optim::simd_path::avx512_bf16)
    return same_bytes_avx512(p, g, m, v, out, n);
  if (path == optim::simd_path::avx2) return same_bytes_avx2(p, g, m, v, out, n);
#endif
  (void)path;
  if (!out) return;
  for (std::size_t i = 0; i < n; ++i) {  // scalar machines: plain copies
    std::uint32_t u;
    std::memcpy(&u, g + i, 4);
    out[i] = static_cast<std::uint16_t>(u >> 16);
  }
}

// The "model name" line of /proc/cpuinfo (the first CPU's), or "unknown CPU".
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const std::size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string("unknown CPU") : line.substr(start);
  }
  return "unknown CPU";
}

// ---- measurement ---------------------------------------------------------------------------------
struct row {
  std::size_t n;
  int threads;
  std::string kernel;
  double bytes_per_param;
  double seconds;              // the best round
  std::vector<double> rounds;  // every timed round, in order
};

// How much faster `a` ran than `b`, as the median over rounds of b's time over a's in the same
// round: a slow spell of a shared machine (seconds long; a round is milliseconds) falls on both
// alike, where the ratio of two best times compares the luckiest run of each.
double paired(const row& a, const row& b) {
  std::vector<double> r;
  for (std::size_t i = 0; i < a.rounds.size() && i < b.rounds.size(); ++i) r.push_back(b.rounds[i] / a.rounds[i]);
  if (r.empty()) return 0;
  std::sort(r.begin(), r.end());
  const std::size_t m = r.size() / 2;
  return r.size() % 2 ? r[m] : 0.5 * (r[m - 1] + r[m]);
}

// The kernels of one configuration are timed in interleaved rounds (every kernel once per
// round, every round's time kept), so a burst of load from other processes on a shared
// machine hits all of them alike instead of one.
struct timed_kernel {
  const char* name;
  double bytes_per_param;
  std::function<void()> run;
  std::vector<double> times;  // per timed round
};

// Each round runs the kernels in a new order (a fixed-seed shuffle), so what the previous kernel
// left in the cache (8M parameters' 224 MB are about a VM's share of a server's last-level cache)
// favours none of them. A rotation of one list does not do that: every kernel keeps the same
// predecessor, and two runs of the same kernel after different predecessors measured 5-10 %
// apart in every round (in a fixed order, 15 %).
void time_interleaved(std::vector<timed_kernel>& kernels, int rounds) {
  std::vector<std::size_t> order(kernels.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffle_rng(20261205);
  for (int it = -1; it < rounds; ++it) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (std::size_t j : order) {
      auto& k = kernels[j];
      const auto t0 = clock_type::now();
      k.run();
      const double t = std::chrono::duration<double>(clock_type::now() - t0).count();
      if (it >= 0) k.times.push_back(t);  // round -1 warms up
    }
  }
}

// Runs body(begin, len) over n in tiles on the pool, as host_adamw splits its range.
template <class F>
void over_tiles(worker_pool& pool, std::size_t n, std::size_t tile, F&& body) {
  auto item = [&](std::size_t t) {
    const std::size_t b = t * tile;
    body(b, std::min(tile, n - b));
  };
  pool.run((n + tile - 1) / tile, item);
}

void measure(std::size_t n, int threads, int reps, std::vector<row>& rows) {
  aligned_array<float> p(n), g(n), m(n), v(n);
  aligned_array<std::uint16_t> out(n);
  fill(p.data, n, -1.0f, 1.0f, 1);
  fill(g.data, n, -1e-3f, 1e-3f, 2);
  fill(m.data, n, -1e-4f, 1e-4f, 3);
  fill(v.data, n, 1e-9f, 1e-7f, 4);
  optim::adamw_config cfg;
  cfg.lr = 1e-4f;
  std::int64_t t = 1;
  auto next_step = [&] { return optim::make_adamw_step(cfg, t++, 1.0f, true); };

  optim::host_adamw best(threads, optim::simd_path::automatic);
  optim::host_adamw scalar(threads, optim::simd_path::scalar);
  const std::size_t tile = best.tile_numel();
  std::vector<timed_kernel> kernels;
  kernels.push_back({"adam_f32", 28, [&] {
                       best.update(next_step(), p.data, m.data, v.data, g.data, n, nullptr, dtype::bf16);
                     }});
  kernels.push_back({"ceil_f32", 28, [&] {
                       over_tiles(best.pool(), n, tile, [&](std::size_t b, std::size_t len) {
                         same_bytes(best.path(), p.data + b, g.data + b, m.data + b, v.data + b, nullptr, len);
                       });
                     }});
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const bool with_reference = optim::path_supported(optim::simd_path::avx512);
  // host_adamw::update with a forced distance, on the same pool and tiles as adam_f32.
  auto adam_with_prefetch = [&](std::size_t bytes) {
    const optim::adamw_step st = next_step();
    over_tiles(best.pool(), n, tile, [&](std::size_t b, std::size_t len) {
      optim::adamw_update_on(best.path(), st, p.data + b, m.data + b, v.data + b, g.data + b, len, nullptr,
                             dtype::bf16, bytes);
    });
  };
  if (with_reference) {
    kernels.push_back({"f32_pf0", 28, [&] { adam_with_prefetch(0); }});
    kernels.push_back({"f32_pf2k", 28, [&] { adam_with_prefetch(optim::intel_tuned_prefetch_bytes); }});
  }
  auto reference = [&](std::uint16_t* o) {
    const reference_adam::constants c(next_step());
    over_tiles(best.pool(), n, tile, [&](std::size_t b, std::size_t len) {
      reference_adam::step(c, p.data + b, m.data + b, v.data + b, g.data + b, len, o ? o + b : nullptr);
    });
  };
  if (with_reference) kernels.push_back({"ref_f32", 28, [&] { reference(nullptr); }});
  if (with_reference)
    kernels.push_back({"ceil_div", 28, [&] {
                         over_tiles(best.pool(), n, tile, [&](std::size_t b, std::size_t len) {
                           same_bytes_avx512<true>(p.data + b, g.data + b, m.data + b, v.data + b, nullptr, len);
                         });
                       }});
#endif
  kernels.push_back({"fused", 30, [&] {
                       best.update(next_step(), p.data, m.data, v.data, g.data, n, out.data, dtype::bf16);
                     }});
  kernels.push_back({"ceiling", 30, [&] {
                       over_tiles(best.pool(), n, tile, [&](std::size_t b, std::size_t len) {
                         same_bytes(best.path(), p.data + b, g.data + b, m.data + b, v.data + b, out.data + b, len);
                       });
                     }});
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (with_reference) kernels.push_back({"ref_bf16", 30, [&] { reference(out.data); }});
#endif
  kernels.push_back({"unfused", 34, [&] {
                       best.update(next_step(), p.data, m.data, v.data, g.data, n, nullptr, dtype::bf16);
                       best.convert(p.data, out.data, dtype::bf16, n);
                     }});
  kernels.push_back({"scalar", 30, [&] {
                       scalar.update(next_step(), p.data, m.data, v.data, g.data, n, out.data, dtype::bf16);
                     }});
  kernels.push_back({"triad", 12, [&] {
                       over_tiles(best.pool(), n, tile, [&](std::size_t b, std::size_t len) {
                         float* a = p.data + b;
                         const float* x = g.data + b;
                         const float* y = m.data + b;
                         for (std::size_t i = 0; i < len; ++i) a[i] = x[i] + 0.5f * y[i];
                       });
                     }});
  time_interleaved(kernels, reps);
  for (const auto& k : kernels)
    rows.push_back({n, threads, k.name, k.bytes_per_param, *std::min_element(k.times.begin(), k.times.end()), k.times});
}

const row* lookup(const std::vector<row>& rows, std::size_t n, int threads, std::string_view kernel) {
  for (const auto& r : rows)
    if (r.n == n && r.threads == threads && r.kernel == kernel) return &r;
  return nullptr;
}
const row& find(const std::vector<row>& rows, std::size_t n, int threads, std::string_view kernel) {
  if (const row* r = lookup(rows, n, threads, kernel)) return *r;
  std::fprintf(stderr, "host_adam: missing row %s\n", std::string(kernel).c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: host_adam [--quick]\n");
      return 2;
    }
  }
  std::vector<std::size_t> sizes = {std::size_t{512} << 10, std::size_t{8} << 20};
  if (!quick) sizes.push_back(std::size_t{128} << 20);
  const std::vector<int> thread_counts = {1, 2};

  const std::string cpu = cpu_model();
  std::printf("host AdamW, bf16 write-back; CPU: %s; vector path %s; %u hardware threads; prefetch %zu bytes%s\n",
              cpu.c_str(), std::string(to_string(optim::best_path())).c_str(), std::thread::hardware_concurrency(),
              optim::adamw_prefetch_bytes(),
              std::getenv("ZSHARD_ADAMW_PREFETCH") ? " (ZSHARD_ADAMW_PREFETCH)" : " (default for this CPU)");
  std::vector<row> rows;
  for (std::size_t n : sizes)
    for (int threads : thread_counts)
      measure(n, threads, n > (std::size_t{16} << 20) ? 6 : n < (std::size_t{1} << 20) ? 60 : (quick ? 5 : 15), rows);

  std::printf("%10s %7s %-8s %11s %9s %10s %8s %10s\n", "params", "threads", "kernel", "bytes/param", "time_ms",
              "Mparams/s", "GB/s", "vs_ceiling");
  double worst_f32 = 1e9, worst_pf0 = 1e9, worst_pf2k = 1e9, worst_bf16 = 1e9, worst_ref = 1e9;
  double worst_unfused = 1e9, worst_scalar = 1e9, worst_divider = 1e9;
  // adam_f32's twin: the side-by-side kernel with the same prefetch distance (f32_pf2k or
  // f32_pf0), the same code on the same pool. Their spread is this run's noise floor.
  const std::size_t distance = optim::adamw_prefetch_bytes();
  const char* twin = distance == optim::intel_tuned_prefetch_bytes ? "f32_pf2k"
                     : distance == 0                                 ? "f32_pf0"
                                                                     : nullptr;
  double worst_twin = 1e9;
  for (std::size_t n : sizes) {
    for (int threads : thread_counts) {
      const row& ceil30 = find(rows, n, threads, "ceiling");
      const row& ceil28 = find(rows, n, threads, "ceil_f32");
      for (const auto& r : rows) {
        if (r.n != n || r.threads != threads) continue;
        const row& c = r.bytes_per_param == 28 ? ceil28 : ceil30;
        const double gbs = r.bytes_per_param * double(n) / r.seconds / 1e9;
        const double ceiling_gbs = c.bytes_per_param * double(n) / c.seconds / 1e9;
        std::printf("%10zu %7d %-8s %11.0f %9.2f %10.1f %8.2f %10.3f\n", n, threads, r.kernel.c_str(), r.bytes_per_param,
                    r.seconds * 1e3, double(n) / r.seconds / 1e6, gbs, gbs / ceiling_gbs);
      }
      const row& fused = find(rows, n, threads, "fused");
      const row& f32 = find(rows, n, threads, "adam_f32");
      // Key figures: paired medians (see paired()); same bytes, so a ratio of times.
      worst_f32 = std::min(worst_f32, paired(f32, ceil28));
      worst_bf16 = std::min(worst_bf16, paired(fused, ceil30));
      if (const row* r = lookup(rows, n, threads, "f32_pf0")) worst_pf0 = std::min(worst_pf0, paired(*r, ceil28));
      if (const row* r = lookup(rows, n, threads, "f32_pf2k")) worst_pf2k = std::min(worst_pf2k, paired(*r, ceil28));
      if (const row* r = lookup(rows, n, threads, "ref_f32")) worst_ref = std::min(worst_ref, paired(f32, *r));
      if (const row* r = lookup(rows, n, threads, "ceil_div")) worst_divider = std::min(worst_divider, paired(f32, *r));
      if (const row* r = lookup(rows, n, threads, "ref_bf16")) worst_ref = std::min(worst_ref, paired(fused, *r));
      if (const row* r = twin ? lookup(rows, n, threads, twin) : nullptr)
        worst_twin = std::min({worst_twin, paired(f32, *r), paired(*r, f32)});
      worst_unfused = std::min(worst_unfused, paired(fused, find(rows, n, threads, "unfused")));
      worst_scalar = std::min(worst_scalar, paired(fused, find(rows, n, threads, "scalar")));
    }
  }
  // The key figures, the two of issue 27 last.
  std::printf("cpu_model: %s\n", cpu.c_str());
  std::printf("adam_vs_bf16_ceiling: %.3f\n", worst_bf16);
  std::printf("fused_vs_unfused: %.3f\n", worst_unfused);
  std::printf("adam_vs_scalar: %.3f\n", worst_scalar);
  if (worst_pf0 < 1e9) std::printf("pf0_vs_f32_ceiling: %.3f\n", worst_pf0);
  if (worst_pf2k < 1e9) std::printf("pf2k_vs_f32_ceiling: %.3f\n", worst_pf2k);
  if (worst_twin < 1e9) std::printf("adam_same_kernel_spread: %.3f\n", worst_twin);
  if (worst_divider < 1e9) std::printf("adam_vs_divider_ceiling: %.3f\n", worst_divider);
  std::printf("adam_vs_f32_ceiling: %.3f\n", worst_f32);
  if (worst_ref < 1e9)
    std::printf("adam_vs_deepspeed: %.3f\n", worst_ref);
  else
    std::printf("adam_vs_deepspeed: n/a (no AVX-512 on this CPU)\n");
  return 0;
}

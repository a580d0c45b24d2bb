// The host AdamW kernels on every path this machine runs (each forced in turn) against the
// scalar reference, a float64 reference and the device-optimizer path (host_backend::adamw);
// the fused bf16/f16 write-back and the cast pass against to_bf16/to_f16 on special values;
// the worker pool and the multi-threaded driver.
//
// Tolerances:
//  - Against adamw_update_scalar: bitwise equal (master, m, v and the working copy), because
//    every path performs the reference's IEEE operations in its order and blocks FMA
//    contraction (optim/adamw_simd_common.hpp). If this test is built with FMA enabled
//    (__FMA__), the compiler may contract the reference itself; then each value may differ by
//    4 ulp per step of the largest term it sums (checked as a relative 4 * 2^-24 * steps).
//  - The avx512_bf16 path's bf16 copy differs from to_bf16 only for f32 subnormals (flushed
//    to a signed zero by VCVTNEPS2BF16); the tests feed it subnormals on purpose and check that.
//  - Against float64: the reference's own tolerance from tests/optim (2e-6 relative, 5e-8
//    absolute for p; 2e-6 of the largest |g| for m; 2e-6 relative for v after ten steps).
#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "adamw_positions.hpp"  // its test case: the same bits in a full vector and in the tail
#include "zshard/backend/host_backend.hpp"
#include "zshard/core/worker_pool.hpp"
#include "zshard/optim/adamw_dispatch.hpp"

using namespace zshard;
using namespace zshard::optim;

namespace {

std::vector<simd_path> runnable_paths() {
  std::vector<simd_path> out;
  for (simd_path p : {simd_path::scalar, simd_path::avx2, simd_path::avx512, simd_path::avx512_bf16})
    if (path_supported(p)) out.push_back(p);
  return out;
}

// Gradients over 10^-6 .. 10^1 so eps, tiny and large second moments are all exercised.
std::vector<float> random_grads(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& e : g) e = normal(rng) * std::pow(10.0f, exponent(rng));
  return g;
}

// The working copy as raw bytes, whatever its dtype (empty when there is none).
struct working_copy {
  std::vector<unsigned char> bytes;
  void* data() { return bytes.empty() ? nullptr : bytes.data(); }
};

// |a - b| within `ulps` f32 ulps of `scale`; NaN never passes.
[[maybe_unused]] bool close(double a, double b, double scale, double ulps) {
  return std::fabs(a - b) <= ulps * 0x1p-24 * scale;
}

struct state {
  std::vector<float> p, m, v;
  working_copy out;
};

// Ten steps on `path` with `threads` threads and tiles of `tile`, next to the scalar reference
// and a float64 AdamW; compares all three.
void run_case(simd_path path, dtype working, bool write_back, std::size_t n, int threads, std::size_t tile,
              bool decay) {
  CAPTURE(to_string(path));
  CAPTURE(to_string(working));
  CAPTURE(write_back);
  CAPTURE(n);
  CAPTURE(threads);
  CAPTURE(tile);
  constexpr int steps = 10;
  adamw_config cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.1f;
  std::mt19937 rng(static_cast<unsigned>(n * 7 + std::size_t(working)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  state got, want;
  got.p.resize(n);
  for (auto& x : got.p) x = normal(rng);
  got.m.assign(n, 0.0f);
  got.v.assign(n, 0.0f);
  if (write_back) got.out.bytes.assign(n * size_of(working), 0);
  want = got;
  std::vector<double> p64(got.p.begin(), got.p.end()), m64(n, 0.0), v64(n, 0.0);

  host_adamw driver(threads, path, tile);
  CHECK(driver.path() == path);
  double max_g = 0.0;
  for (int t = 1; t <= steps; ++t) {
    const std::vector<float> grad = random_grads(rng, n);
    const float gs = 0.37f;
    const adamw_step s = make_adamw_step(cfg, t, gs, decay);
    driver.update(s, got.p.data(), got.m.data(), got.v.data(), grad.data(), n, got.out.data(), working);
    adamw_update_scalar(s, want.p.data(), want.m.data(), want.v.data(), grad.data(), n, want.out.data(), working);
    const double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = decay ? cfg.weight_decay : 0.0f;
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    for (std::size_t i = 0; i < n; ++i) {
      const double g = double(grad[i]) * double(gs);
      max_g = std::max(max_g, std::fabs(g));
      m64[i] = b1 * m64[i] + (1.0 - b1) * g;
      v64[i] = b2 * v64[i] + (1.0 - b2) * g * g;
      p64[i] = p64[i] - lr * wd * p64[i] - lr * (m64[i] / bc1) / (std::sqrt(v64[i] / bc2) + eps);
    }
  }

  std::size_t differ = 0;
#if defined(__FMA__)
  for (std::size_t i = 0; i < n; ++i)
    differ += !close(got.p[i], want.p[i], std::fabs(want.p[i]) + 1e-2, 4 * steps) ||
              !close(got.m[i], want.m[i], max_g, 4 * steps) || !close(got.v[i], want.v[i], want.v[i], 4 * steps);
#else
  differ = std::memcmp(got.p.data(), want.p.data(), n * 4) != 0 || std::memcmp(got.m.data(), want.m.data(), n * 4) != 0 ||
           std::memcmp(got.v.data(), want.v.data(), n * 4) != 0;
  if (write_back) differ += got.out.bytes != want.out.bytes;
#endif
  CHECK(differ == 0);

  // The working copy is exactly the rounded master on every path (subnormals aside, see top).
  if (write_back) {
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t expect = 0, have = 0;
      if (working == dtype::f32) {
        mismatches += std::memcmp(got.out.bytes.data() + 4 * i, &got.p[i], 4) != 0;
        continue;
      }
      expect = working == dtype::bf16 ? to_bf16(got.p[i]).bits : to_f16(got.p[i]).bits;
      std::memcpy(&have, got.out.bytes.data() + 2 * i, 2);
      mismatches += have != expect;
    }
    CHECK(mismatches == 0);
  }

  double worst_p = 0, worst_m = 0, worst_v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst_p = std::max(worst_p, std::fabs(got.p[i] - p64[i]) / (std::fabs(p64[i]) + 5e-8 / 2e-6));
    worst_m = std::max(worst_m, std::fabs(got.m[i] - m64[i]) / max_g);
    worst_v = std::max(worst_v, std::fabs(got.v[i] - v64[i]) / std::max(v64[i], 1e-300));
  }
  INFO("worst relative error vs float64: p " << worst_p << ", m " << worst_m << ", v " << worst_v);
  CHECK(worst_p <= 2e-6);
  CHECK(worst_m <= 2e-6);
  CHECK(worst_v <= 2e-6);
}

// Floats that exercise rounding: ties, NaN payloads, infinities, zeros, f32 and f16
// subnormals, the f16 overflow boundary, and random bit patterns.
std::vector<float> special_floats() {
  std::vector<std::uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,  // zeros, infinities
      0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa5a5a5u,  // quiet and signalling NaNs with payloads
      0x00000001u, 0x807fffffu, 0x00400000u,               // f32 subnormals
      0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu,  // bf16 ties (to even, both ways) and near-ties
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu,  // f16: 65504, just below and at the overflow threshold
      0x33000000u, 0x33000001u, 0x33800000u, 0x387fc000u,  // f16 subnormal range and its edges
      0x38800000u, 0x3f801000u, 0x3f803000u, 0x7f7fffffu,  // smallest f16 normal, f16 ties, f32 max (bf16 overflow)
  };
  std::mt19937 rng(99);
  for (int i = 0; i < 4000; ++i) bits.push_back(static_cast<std::uint32_t>(rng()));
  std::vector<float> out;
  for (auto b : bits) out.push_back(std::bit_cast<float>(b));
  return out;
}

bool is_f32_subnormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL; }

}  // namespace

TEST_CASE("host AdamW: every runnable path equals the scalar reference and float64, all dtypes, tails, threads") {
  const auto paths = runnable_paths();
  MESSAGE("runnable paths on this CPU: " << paths.size() << " (best " << to_string(best_path()) << ")");
  for (simd_path path : paths)
    for (dtype w : {dtype::f32, dtype::bf16, dtype::f16})
      for (bool write_back : {true, false}) {
        if (!write_back && w != dtype::f32) continue;
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{17}, std::size_t{31},
                              std::size_t{33}, std::size_t{1037}})
          run_case(path, w, write_back, n, 1, 64, true);
        for (int threads : {1, 2, 3}) run_case(path, w, write_back, 10007, threads, 96, threads != 2);
      }
}

TEST_CASE("host AdamW: the kernels equal the device-optimizer path of the host backend") {
  // host_backend::adamw is what the default (on-device) Offloader runs.
  constexpr std::size_t n = 4099;
  std::mt19937 rng(5);
  const auto grad = random_grads(rng, n);
  host_backend backend;
  host_backend::stream s;
  for (simd_path path : runnable_paths()) {
    for (dtype w : {dtype::f32, dtype::bf16, dtype::f16}) {
      CAPTURE(to_string(path));
      CAPTURE(to_string(w));
      std::vector<float> p1(n, 0.5f), m1(n, 0.01f), v1(n, 0.02f), p2 = p1, m2 = m1, v2 = v1;
      std::vector<unsigned char> o1(n * 4), o2(n * 4);
      for (int t = 1; t <= 3; ++t) {
        const adamw_step st = make_adamw_step(adamw_config{}, t, 0.25f, t != 2);
        adamw_update_on(path, st, p1.data(), m1.data(), v1.data(), grad.data(), n, o1.data(), w);
        backend.adamw(st, p2.data(), m2.data(), v2.data(), grad.data(), n, o2.data(), w, s);
      }
#if !defined(__FMA__)
      CHECK(p1 == p2);
      CHECK(m1 == m2);
      CHECK(v1 == v2);
      CHECK(o1 == o2);
#endif
    }
  }
}

TEST_CASE("host AdamW: bf16/f16 rounding of the write-back and the cast pass on special values") {
  const std::vector<float> x = special_floats();
  const std::size_t n = x.size();
  for (simd_path path : runnable_paths()) {
    CAPTURE(to_string(path));
    std::vector<bf16> b(n);
    std::vector<f16> h(n);
    std::vector<float> f(n);
    convert_on(path, x.data(), b.data(), dtype::bf16, n);
    convert_on(path, x.data(), h.data(), dtype::f16, n);
    convert_on(path, x.data(), f.data(), dtype::f32, n);
    std::size_t bad_b = 0, bad_h = 0, flushed = 0;
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(std::bit_cast<std::uint32_t>(x[i]));
      bad_h += !(h[i] == to_f16(x[i]));
      if (path == simd_path::avx512_bf16 && is_f32_subnormal(x[i])) {
        // VCVTNEPS2BF16 flushes subnormals to a signed zero (in the tail too: same instruction)
        bad_b += b[i].bits != (std::bit_cast<std::uint32_t>(x[i]) >> 16 & 0x8000u);
        ++flushed;
      } else {
        bad_b += !(b[i] == to_bf16(x[i]));
      }
    }
    CHECK(bad_b == 0);
    CHECK(bad_h == 0);
    CHECK(std::memcmp(f.data(), x.data(), n * 4) == 0);
    if (path == simd_path::avx512_bf16) CHECK(flushed > 0);
  }
}

TEST_CASE("host AdamW: path selection, forcing and the CPU feature checks") {
  CHECK(path_supported(simd_path::scalar));
  CHECK(resolve(simd_path::automatic) == best_path());
  CHECK(resolve(simd_path::scalar) == simd_path::scalar);
  const cpu_features none{};
  CHECK(best_path(none) == simd_path::scalar);
  CHECK(!path_supported(simd_path::avx2, none));
  CHECK(!path_supported(simd_path::avx512, none));
  cpu_features no_bf16{.avx2 = true, .fma = true, .f16c = true, .avx512f = true, .avx512bw = true, .avx512vl = true,
                       .avx512dq = true, .avx512_bf16 = false};
  if (simd_paths_compiled()) CHECK(best_path(no_bf16) == simd_path::avx512);
  CHECK(!path_supported(simd_path::avx512_bf16, no_bf16));
  for (simd_path p : {simd_path::avx2, simd_path::avx512, simd_path::avx512_bf16}) {
    if (path_supported(p)) continue;
    try {  // a forced path the CPU lacks must fail loudly, never run an illegal instruction
      host_adamw h(1, p);
      FAIL("forcing an unsupported path did not throw");
    } catch (const error& e) {
      CHECK(e.kind() == error_kind::config);
    }
  }
  CHECK_THROWS_AS(host_adamw(1, simd_path::scalar, 0), error);
  CHECK(host_adamw(1, simd_path::scalar, 33).tile_numel() == 64);  // whole cache lines
}

TEST_CASE("worker_pool: every item runs exactly once, run() and start()/wait(), any thread count") {
  for (int threads : {1, 2, 3, 5}) {
    CAPTURE(threads);
    worker_pool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}}) {
      std::vector<std::atomic<int>> hits(count);
      auto body = [&](std::size_t i) { hits[i].fetch_add(1, std::memory_order_relaxed); };
      for (int rep = 0; rep < 3; ++rep) pool.run(count, body);
      for (auto& h : hits) CHECK(h.load() == 3);
    }
    // start() returns while helpers work; the caller's own work overlaps; wait() joins.
    std::vector<int> out(512, 0);
    auto fill = [&](std::size_t i) { out[i] = static_cast<int>(i) * 2; };
    pool.start(out.size(), fill);
    int mine = 0;
    for (int i = 0; i < 1000; ++i) mine += i;
    pool.wait();
    CHECK(mine == 499500);
    for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == static_cast<int>(i) * 2);
    // A started job is joined by the next run() and by the destructor.
    std::vector<int> more(300, 0);
    auto bump = [&](std::size_t i) { ++more[i]; };
    pool.start(more.size(), bump);
    pool.run(more.size(), bump);
    for (int v : more) REQUIRE(v == 2);
    {
      worker_pool short_lived(threads);  // declared after `more` and `bump`: joined before they go
      short_lived.start(more.size(), bump);
    }
    for (int v : more) REQUIRE(v == 3);
  }
  CHECK(worker_pool(0).size() >= 1);  // 0: one per hardware thread
  CHECK_THROWS_AS(worker_pool(-1), error);
}

// The vector kernels divide by sqrt(bias_correction2) without a division (Markstein's
// correction, adamw_avx512.hpp); the quotient must still be the correctly rounded one for every
// second moment, whatever the step's bias correction: second moments across the whole range
// (zero, tiny, huge, infinite) and many (beta2, t), bitwise against the scalar reference.
TEST_CASE("host AdamW: the division by sqrt(bias_correction2) is exact on every path, every magnitude") {
#if defined(__FMA__)
  MESSAGE("built with FMA: the scalar reference itself is contracted; bitwise check skipped");
  return;
#endif
  std::mt19937 rng(2024);
  constexpr std::size_t n = 4096 + 13;
  std::vector<float> v0(n), grad(n, 0.0f);  // g = 0: v' = beta2 * v, so sqrt(v') spans what v spans
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t exponent = 1 + rng() % 254, mantissa = rng() & 0x7fffffu;
    v0[i] = std::bit_cast<float>(exponent << 23 | mantissa);
  }
  v0[0] = 0.0f;
  v0[1] = std::numeric_limits<float>::infinity();
  v0[2] = std::numeric_limits<float>::max();
  v0[3] = std::numeric_limits<float>::denorm_min();
  for (int trial = 0; trial < 40; ++trial) {
    adamw_config cfg;
    cfg.beta2 = 0.9f + 0.0999f * float(rng() % 1000) / 1000.0f;
    const std::int64_t t = 1 + std::int64_t(rng() % 3000);
    const adamw_step s = make_adamw_step(cfg, t, 1.0f, true);
    for (simd_path path : runnable_paths()) {
      std::vector<float> p1(n, 0.25f), m1(n, 1e-3f), v1 = v0, p2 = p1, m2 = m1, v2 = v0;
      adamw_update_on(path, s, p1.data(), m1.data(), v1.data(), grad.data(), n, nullptr, dtype::f32);
      adamw_update_scalar(s, p2.data(), m2.data(), v2.data(), grad.data(), n, nullptr, dtype::f32);
      INFO("path " << to_string(path) << ", beta2 " << cfg.beta2 << ", t " << t);
      CHECK(std::memcmp(p1.data(), p2.data(), n * 4) == 0);
      CHECK(std::memcmp(v1.data(), v2.data(), n * 4) == 0);
    }
  }
}

TEST_CASE("host AdamW: every software prefetch distance gives bitwise the same results, every path and dtype") {
  // The prefetch (adamw_prefetch.hpp) may change only the speed: master, m, v and the working
  // copy after three steps equal those with no prefetch, bit for bit, including at the ends of
  // the arrays, where the prefetched addresses lie past the end.
  std::mt19937 rng(11);
  for (simd_path path : runnable_paths())
    for (dtype w : {dtype::f32, dtype::bf16, dtype::f16})
      for (bool write_back : {true, false}) {
        if (!write_back && w != dtype::f32) continue;
        for (std::size_t n : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{1037},
                              std::size_t{10007}}) {
          const auto grad = random_grads(rng, n);
          auto run = [&](std::size_t prefetch) {
            state s{std::vector<float>(n, 0.5f), std::vector<float>(n, 0.01f), std::vector<float>(n, 0.02f), {}};
            if (write_back) s.out.bytes.assign(n * size_of(w), 0);
            for (int t = 1; t <= 3; ++t)
              adamw_update_on(path, make_adamw_step(adamw_config{}, t, 0.5f, t != 2), s.p.data(), s.m.data(),
                              s.v.data(), grad.data(), n, s.out.data(), w, prefetch);
            return s;
          };
          const state off = run(0);
          for (std::size_t prefetch : {std::size_t{64}, std::size_t{512}, intel_tuned_prefetch_bytes,
                                       max_prefetch_bytes, adamw_prefetch_bytes()}) {
            CAPTURE(to_string(path));
            CAPTURE(to_string(w));
            CAPTURE(n);
            CAPTURE(prefetch);
            const state on = run(prefetch);
            CHECK(std::memcmp(on.p.data(), off.p.data(), n * sizeof(float)) == 0);
            CHECK(std::memcmp(on.m.data(), off.m.data(), n * sizeof(float)) == 0);
            CHECK(std::memcmp(on.v.data(), off.v.data(), n * sizeof(float)) == 0);
            CHECK(on.out.bytes == off.out.bytes);
          }
        }
      }
  // And through the threaded driver, which passes its own distance to every tile.
  constexpr std::size_t n = 5000;
  const auto grad = random_grads(rng, n);
  std::vector<std::vector<float>> p(2, std::vector<float>(n, 0.25f)), m(2, std::vector<float>(n, 0.0f)),
      v(2, std::vector<float>(n, 0.0f));
  std::vector<std::vector<bf16>> out(2, std::vector<bf16>(n));
  host_adamw off(2, simd_path::automatic, 64, 0), on(2, simd_path::automatic, 64, intel_tuned_prefetch_bytes);
  CHECK(off.prefetch_bytes() == 0);
  CHECK(on.prefetch_bytes() == intel_tuned_prefetch_bytes);
  for (int t = 1; t <= 3; ++t) {
    const adamw_step st = make_adamw_step(adamw_config{}, t, 1.0f, true);
    off.update(st, p[0].data(), m[0].data(), v[0].data(), grad.data(), n, out[0].data(), dtype::bf16);
    on.update(st, p[1].data(), m[1].data(), v[1].data(), grad.data(), n, out[1].data(), dtype::bf16);
  }
  CHECK(std::memcmp(p[0].data(), p[1].data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(m[0].data(), m[1].data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(v[0].data(), v[1].data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(out[0].data(), out[1].data(), n * sizeof(bf16)) == 0);
}

TEST_CASE("host AdamW: ZSHARD_ADAMW_PREFETCH's values, and bad ones refused with a config error") {
  CHECK(parse_prefetch_bytes(nullptr) == default_prefetch_bytes());
  CHECK(parse_prefetch_bytes("") == default_prefetch_bytes());
  CHECK((default_prefetch_bytes() == 0 || default_prefetch_bytes() == intel_tuned_prefetch_bytes));
  CHECK(parse_prefetch_bytes("0") == 0);
  CHECK(parse_prefetch_bytes("4096") == 4096);
  CHECK(parse_prefetch_bytes("65536") == max_prefetch_bytes);
  for (const char* bad : {"-64", "2k", "1.5", "65537", "off", "1e9"}) {
    CAPTURE(bad);
    try {
      (void)parse_prefetch_bytes(bad);
      FAIL("a malformed ZSHARD_ADAMW_PREFETCH was accepted");
    } catch (const error& e) {
      CHECK(e.kind() == error_kind::config);
      CHECK(std::string(e.what()).find(std::string("'") + bad + "'") != std::string::npos);  // names the value
    }
  }
  CHECK_THROWS_AS(host_adamw(1, simd_path::scalar, 64, max_prefetch_bytes + 1), error);
}

// The host backend: aligned memory through the ledger and its caching allocator, stream-ordered
// copies and conversions, AdamW on the vector path.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/core/buffer.hpp"

using namespace zshard;

namespace {
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}
}  // namespace

TEST_CASE("host backend: allocations are aligned and accounted") {
  host_backend b;
  for (std::size_t bytes : {1u, 63u, 64u, 1000u, 1u << 20}) {
    void* p = b.allocate(bytes, mem_category::scratch);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % host_backend::alignment == 0);
    CHECK(b.ledger().current(mem_category::scratch) == bytes);
    b.deallocate(p, bytes, mem_category::scratch);
  }
  CHECK(b.allocate(0, mem_category::scratch) == nullptr);
  CHECK(b.ledger().total_current() == 0);
}

TEST_CASE("host backend: copy, fill and convert on a stream, ordered by events") {
  host_backend b;
  auto s1 = b.make_stream();
  auto s2 = b.make_stream();
  auto e = b.make_event();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const std::size_t n = 4097;
  buffer<host_backend> src(b, dtype::f32, n, mem_category::scratch);
  buffer<host_backend> half(b, dtype::bf16, n, mem_category::scratch);
  buffer<host_backend> back(b, dtype::f32, n, mem_category::scratch);
  for (std::size_t i = 0; i < n; ++i) src.as<float>()[i] = normal(rng);
  b.convert(src.data(), dtype::f32, half.data(), dtype::bf16, n, s1);
  b.record(e, s1);
  b.wait(s2, e);
  b.convert(half.data(), dtype::bf16, back.data(), dtype::f32, n, s2);
  b.synchronize(s2);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(back.as<float>()[i] == to_float(to_bf16(src.as<float>()[i])));
  b.fill_zero(back.data(), back.bytes(), s1);
  b.copy(half.data(), back.data(), n * 2, s1);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(half.as<bf16>()[i].bits == 0);
}

// ---- the caching allocator --------------------------------------------------------------------

TEST_CASE("host block cache: size classes cover the request, stay aligned, waste at most 1/8") {
  std::mt19937_64 rng(17);
  std::size_t prev_bytes = 0, prev_class = 0;
  for (std::size_t bytes = 1; bytes < (std::size_t{1} << 24); bytes += 1 + bytes / 7 + rng() % 97) {
    const std::size_t c = host_block_cache::class_bytes(bytes);
    REQUIRE(c >= bytes);
    REQUIRE(c % host_block_cache::alignment == 0);
    if (bytes > host_block_cache::small_limit) REQUIRE(double(c) <= double(bytes) * 1.125 + 1.0);
    REQUIRE(host_block_cache::class_bytes(c) == c);  // a class is its own class
    if (bytes > prev_bytes) REQUIRE(c >= prev_class);  // monotone
    prev_bytes = bytes;
    prev_class = c;
  }
}

TEST_CASE("host backend: a freed block is reused, the ledger counts logical bytes, reserved beside it") {
  host_backend b;
  const std::size_t bytes = 3 * 1000 * 1000 + 7;  // not a class size
  void* p = b.allocate(bytes, mem_category::gathered_params);
  std::memset(p, 1, bytes);
  CHECK(b.ledger().current(mem_category::gathered_params) == bytes);
  CHECK(b.reserved_bytes() == host_block_cache::class_bytes(bytes));
  b.deallocate(p, bytes, mem_category::gathered_params);
  CHECK(b.ledger().total_current() == 0);
  CHECK(b.ledger().peak(mem_category::gathered_params) == bytes);
  CHECK(b.cached_bytes() == host_block_cache::class_bytes(bytes));
  CHECK(b.reserved_bytes() == b.cached_bytes());

  // any request of the same class gets the block back, in any category
  void* q = b.allocate(bytes - 100, mem_category::grad_buckets);
  CHECK(q == p);
  CHECK(b.cache().counters().hits == 1);
  CHECK(b.cache().counters().misses == 1);
  CHECK(b.ledger().current(mem_category::grad_buckets) == bytes - 100);
  CHECK(b.cached_bytes() == 0);
  // a different class does not
  void* r = b.allocate(bytes * 2, mem_category::scratch);
  CHECK(r != p);
  CHECK(b.cache().counters().misses == 2);
  b.deallocate(q, bytes - 100, mem_category::grad_buckets);
  b.deallocate(r, bytes * 2, mem_category::scratch);
  CHECK(b.ledger().total_current() == 0);
  CHECK(b.reserved_bytes() >= 3 * bytes);
}

TEST_CASE("host backend: release_cached returns the cache, blocks in use stay") {
  host_backend b;
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t bytes : {100u, 5000u, 70000u, 1u << 20, 3u << 20})
    blocks.emplace_back(b.allocate(bytes, mem_category::scratch), bytes);
  void* kept = b.allocate(12345, mem_category::sharded_params);
  std::memset(kept, 7, 12345);
  std::size_t expect_cached = 0;
  for (auto [p, bytes] : blocks) {
    b.deallocate(p, bytes, mem_category::scratch);
    expect_cached += host_block_cache::class_bytes(bytes);
  }
  CHECK(b.cached_bytes() == expect_cached);
  CHECK(b.release_cached() == expect_cached);
  CHECK(b.cached_bytes() == 0);
  CHECK(b.reserved_bytes() == host_block_cache::class_bytes(12345));
  CHECK(b.release_cached() == 0);
  CHECK(static_cast<unsigned char*>(kept)[12344] == 7);
  CHECK(b.ledger().current(mem_category::sharded_params) == 12345);
  b.deallocate(kept, 12345, mem_category::sharded_params);
}

TEST_CASE("host backend: a cache limit frees what does not fit; limit 0 caches nothing") {
  host_backend none(std::nullopt, "none", std::size_t{0});
  void* p = none.allocate(1 << 20, mem_category::scratch);
  none.deallocate(p, 1 << 20, mem_category::scratch);
  CHECK(none.cached_bytes() == 0);
  CHECK(none.reserved_bytes() == 0);

  host_backend small(std::nullopt, "small", std::size_t{1} << 20);
  void* a = small.allocate(1 << 20, mem_category::scratch);
  void* c = small.allocate(1 << 20, mem_category::scratch);
  small.deallocate(a, 1 << 20, mem_category::scratch);
  small.deallocate(c, 1 << 20, mem_category::scratch);  // over the limit: freed
  CHECK(small.cached_bytes() == std::size_t{1} << 20);
  CHECK(small.cache().counters().frees == 1);
  small.cache().set_cache_limit(std::size_t{0});  // lowering it releases at once
  CHECK(small.cached_bytes() == 0);
}

TEST_CASE("host backend: the budget still applies to logical bytes; a refused request changes nothing") {
  const std::size_t budget = 4096 + 100;  // the class of 4097 bytes (4608) is over it, 4097 is not
  host_backend b(budget);
  void* p = b.allocate(4097, mem_category::scratch);
  CHECK(b.ledger().total_current() == 4097);
  CHECK(b.reserved_bytes() == 4608);
  const std::size_t misses = b.cache().counters().misses;
  CHECK_THROWS_AS(b.allocate(100, mem_category::gathered_params), error);
  CHECK(b.ledger().total_current() == 4097);
  CHECK(b.ledger().current(mem_category::gathered_params) == 0);
  CHECK(b.cache().counters().misses == misses);
  CHECK(b.reserved_bytes() == 4608);
  b.deallocate(p, 4097, mem_category::scratch);
}

TEST_CASE("host backend: a steady allocate/free loop takes no page faults after warm-up") {
  host_backend b;
  const std::size_t sizes[] = {std::size_t{4} << 20, std::size_t{1} << 20, 300000};
  auto round = [&] {
    void* ps[3];
    for (int i = 0; i < 3; ++i) {
      ps[i] = b.allocate(sizes[i], mem_category::gathered_params);
      std::memset(ps[i], i + 1, sizes[i]);  // touch every page
    }
    for (int i = 0; i < 3; ++i) b.deallocate(ps[i], sizes[i], mem_category::gathered_params);
  };
  round();  // warm-up: the blocks are faulted in once
  const long before = minor_faults();
  for (int it = 0; it < 20; ++it) round();
  const long faults = minor_faults() - before;
  // Through the C heap each round maps and faults in ~1,350 pages again (20 rounds: ~27,000).
  INFO("minor faults over 20 rounds: " << faults);
  CHECK(faults < 200);
  CHECK(b.cache().counters().misses == 3);
}

TEST_CASE("host backend: one backend per rank thread, used concurrently, share nothing") {
  run_ranks(4, [](thread_comm& comm) {
    host_backend b(std::nullopt, "rank " + std::to_string(comm.rank()));
    std::mt19937 rng(static_cast<unsigned>(comm.rank()) + 5);
    std::vector<std::pair<unsigned char*, std::size_t>> live;
    for (int it = 0; it < 400; ++it) {
      if (live.empty() || rng() % 3 != 0) {
        const std::size_t bytes = 1 + rng() % 200000;
        auto* p = static_cast<unsigned char*>(b.allocate(bytes, mem_category::scratch));
        std::memset(p, comm.rank() + 1, bytes);
        live.emplace_back(p, bytes);
      } else {
        const std::size_t k = rng() % live.size();
        auto [p, bytes] = live[k];
        // nobody else wrote into this block while it was ours
        REQUIRE(p[0] == comm.rank() + 1);
        REQUIRE(p[bytes - 1] == comm.rank() + 1);
        b.deallocate(p, bytes, mem_category::scratch);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    std::size_t logical = 0;
    for (auto [p, bytes] : live) logical += bytes;
    REQUIRE(b.ledger().total_current() == logical);
    REQUIRE(b.reserved_bytes() >= logical);
    for (auto [p, bytes] : live) b.deallocate(p, bytes, mem_category::scratch);
    comm.barrier();
  });
}

TEST_CASE("host backend: AdamW runs the vector path and equals the scalar reference bit for bit") {
#if defined(__FMA__)
  MESSAGE("built with FMA: the scalar reference itself is contracted (adamw_simd_common.hpp); bitwise check skipped");
  return;
#endif
  host_backend b;
  auto s = b.make_stream();
  CHECK(b.adamw_path() != optim::simd_path::avx512_bf16);
  CHECK(b.adamw_path() == (optim::best_path() == optim::simd_path::avx512_bf16 ? optim::simd_path::avx512
                                                                              : optim::best_path()));
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  for (std::size_t n : {1u, 15u, 16u, 17u, 1000u, 4099u}) {
    for (dtype w : {dtype::f32, dtype::bf16, dtype::f16}) {
      std::vector<float> p(n), m(n), v(n), g(n);
      for (std::size_t i = 0; i < n; ++i) {
        p[i] = normal(rng);
        m[i] = 0.1f * normal(rng);
        v[i] = std::abs(0.01f * normal(rng));
        g[i] = normal(rng);
      }
      auto p2 = p, m2 = m, v2 = v;
      std::vector<std::uint16_t> out(n), out2(n);
      std::vector<float> outf(n), outf2(n);
      void* o = w == dtype::f32 ? static_cast<void*>(outf.data()) : out.data();
      void* o2 = w == dtype::f32 ? static_cast<void*>(outf2.data()) : out2.data();
      const auto st = optim::make_adamw_step(optim::adamw_config{}, 3, 0.7f, true);
      b.adamw(st, p.data(), m.data(), v.data(), g.data(), n, o, w, s);
      optim::adamw_update_scalar(st, p2.data(), m2.data(), v2.data(), g.data(), n, o2, w);
      REQUIRE(std::memcmp(p.data(), p2.data(), n * 4) == 0);
      REQUIRE(std::memcmp(m.data(), m2.data(), n * 4) == 0);
      REQUIRE(std::memcmp(v.data(), v2.data(), n * 4) == 0);
      REQUIRE(out == out2);
      REQUIRE(std::memcmp(outf.data(), outf2.data(), n * 4) == 0);
    }
  }
}

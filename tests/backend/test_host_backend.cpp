// The host backend: aligned memory through the ledger, stream-ordered copies and conversions.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/core/buffer.hpp"

using namespace zshard;

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

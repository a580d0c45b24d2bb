#pragma once
// Shared by the MPI tests: the communicator options they use, rank-seeded random inputs every
// process can regenerate for any rank, and the serial reference of the reduction contract.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <random>
#include <vector>

#include "zshard/comm/mpi_comm.hpp"

namespace mpi_test {

using namespace zshard;
using bytes = std::vector<std::byte>;

// Short enough that a broken test fails well within ctest's timeout.
inline mpi_options options() { return {.timeout = std::chrono::milliseconds(20'000)}; }

inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::bf16, dtype::f16};

// Rank q's input of case `seed`: normal(0, 1) values stored in t; the same on every process.
inline bytes input(dtype t, std::size_t n, std::uint32_t seed, int q) {
  std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(q));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  bytes b(n * size_of(t));
  for (std::size_t i = 0; i < n; ++i) store_from_float(b.data(), t, i, normal(rng) * (1.0f + float(i % 7)));
  return b;
}

// The contract, written serially: elements [begin, begin + n) of every source, f32 in rank
// order, one division for average, one rounding to t.
inline bytes reference_reduce(const std::vector<bytes>& srcs, std::size_t begin, std::size_t n, dtype t, reduce_op op) {
  bytes out(n * size_of(t));
  for (std::size_t i = 0; i < n; ++i) {
    float acc = load_as_float(srcs[0].data(), t, begin + i);
    for (std::size_t q = 1; q < srcs.size(); ++q) {
      const float x = load_as_float(srcs[q].data(), t, begin + i);
      acc = op == reduce_op::max ? std::max(acc, x) : acc + x;
    }
    if (op == reduce_op::average) acc /= static_cast<float>(srcs.size());
    store_from_float(out.data(), t, i, acc);
  }
  return out;
}

inline bool same_bytes(const std::byte* a, const std::byte* b, std::size_t n) { return std::equal(a, a + n, b); }

}  // namespace mpi_test

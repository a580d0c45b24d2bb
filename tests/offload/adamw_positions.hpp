#pragma once
// Issue 26: an element gets the same bits from a host AdamW kernel (and the cast pass) whether
// it falls in a full vector or in the tail after the last one. Shards and tiles end wherever
// the world size puts them, so otherwise training would depend on the world size. Each element
// of a random array is updated once with the whole array (most of it in full vectors) and
// again inside sub-ranges shifted by 0..16 elements, of lengths that end in every tail length,
// and alone (always a tail); every result must equal the first bit for bit, on every path this
// CPU runs, for every working dtype.
//
// Included by offload/test_adamw_kernels.cpp (the tests' baseline build) and by
// native/test_native.cpp, built with -march=native: there the compiler may contract scalar code
// into FMAs, which round once where the kernels' vector code rounds twice.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zshard/optim/adamw_dispatch.hpp"

namespace adamw_positions {

using namespace zshard;
using namespace zshard::optim;

#if defined(__FMA__)
inline constexpr const char* build_note = " (this program is built with FMA)";
#else
inline constexpr const char* build_note = "";
#endif

struct arrays {
  std::vector<float> p, m, v;
  std::vector<unsigned char> out;
};

// Elements that differ between `a` restricted to [begin, begin + n) and the same range of `whole`.
inline std::size_t differing(const arrays& a, const arrays& whole, std::size_t begin, std::size_t n, std::size_t w) {
  std::size_t bad = 0;
  for (std::size_t i = begin; i < begin + n; ++i)
    bad += std::memcmp(&a.p[i], &whole.p[i], 4) != 0 || std::memcmp(&a.m[i], &whole.m[i], 4) != 0 ||
           std::memcmp(&a.v[i], &whole.v[i], 4) != 0 ||
           (!a.out.empty() && std::memcmp(&a.out[i * w], &whole.out[i * w], w) != 0);
  return bad;
}

// Returns the number of elements whose bits depended on their position (0 expected).
inline std::size_t position_dependent_elements(simd_path path, dtype working, bool write_back) {
  constexpr std::size_t n = 203;  // 12 vectors of 16 (25 of 8) and a tail of 11 (3)
  const std::size_t w = size_of(working);
  std::mt19937 rng(unsigned(26 + std::size_t(working) * 3 + (write_back ? 1 : 0)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 1.0f);
  arrays start;
  std::vector<float> grad(n);
  for (std::size_t i = 0; i < n; ++i) {
    start.p.push_back(normal(rng));
    start.m.push_back(normal(rng) * 1e-2f);
    start.v.push_back(std::fabs(normal(rng)) * std::pow(10.0f, 2 * exponent(rng)));
    grad[i] = normal(rng) * std::pow(10.0f, exponent(rng));
  }
  if (write_back) start.out.assign(n * w, 0);
  adamw_config cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.1f;
  const adamw_step s = make_adamw_step(cfg, 3, 0.37f, true);
  auto run = [&](arrays& a, std::size_t begin, std::size_t len) {
    adamw_update_on(path, s, a.p.data() + begin, a.m.data() + begin, a.v.data() + begin, grad.data() + begin, len,
                    write_back ? a.out.data() + begin * w : nullptr, working);
  };
  arrays whole = start;
  run(whole, 0, n);
  std::size_t bad = 0;
  for (std::size_t shift = 0; shift <= 16; ++shift)
    for (std::size_t len : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{9}, std::size_t{15},
                            std::size_t{16}, std::size_t{17}, std::size_t{31}, std::size_t{46}, n - shift}) {
      arrays a = start;
      run(a, shift, len);
      bad += differing(a, whole, shift, len, w);
    }
  arrays alone = start;
  for (std::size_t i = 0; i < n; ++i) run(alone, i, 1);
  bad += differing(alone, whole, 0, n, w);

  // The cast pass, likewise.
  std::vector<unsigned char> cast_whole(n * w), cast_part(n * w);
  convert_on(path, whole.p.data(), cast_whole.data(), working, n);
  for (std::size_t shift = 0; shift <= 16; ++shift) {
    convert_on(path, whole.p.data() + shift, cast_part.data() + shift * w, working, n - shift);
    for (std::size_t i = shift; i < n; ++i) bad += std::memcmp(&cast_part[i * w], &cast_whole[i * w], w) != 0;
  }
  return bad;
}

inline void check_every_runnable_path() {
  for (simd_path path : {simd_path::scalar, simd_path::avx2, simd_path::avx512, simd_path::avx512_bf16}) {
    if (!path_supported(path)) continue;
    for (dtype working : {dtype::f32, dtype::bf16, dtype::f16})
      for (bool write_back : {true, false}) {
        if (!write_back && working != dtype::f32) continue;
        INFO("path " << to_string(path) << ", working " << to_string(working) << ", write-back " << write_back);
        CHECK(position_dependent_elements(path, working, write_back) == 0);
      }
  }
}

}  // namespace adamw_positions

TEST_CASE("host AdamW: an element gets the same bits in a full vector and in the tail, on every runnable path") {
  MESSAGE("widest path on this CPU: " << zshard::optim::to_string(zshard::optim::best_path())
                                      << std::string(adamw_positions::build_note));
  adamw_positions::check_every_runnable_path();
}

#pragma once
// Stateless hashing and a tiny stateful generator. Everything random in the example
// (initial weights, the synthetic corpus, batch sampling) is a pure function of a seed and
// an index, so every rank, every sharding and the single-process reference see the same
// numbers without sharing a generator.
#include <cstdint>
#include <string_view>

namespace gpt {

// splitmix64's finaliser: a bijective 64-bit mix with good avalanche.
constexpr uint64_t splitmix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t hash_combine(uint64_t a, uint64_t b) noexcept {
  return splitmix64(a ^ splitmix64(b));
}

// FNV-1a: stable across platforms (std::hash is not), so names can seed streams.
constexpr uint64_t hash_string(std::string_view s) noexcept {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Uniform in [0, 1) from the top 53 bits.
constexpr double unit_uniform(uint64_t h) noexcept {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// Sequential generator for the corpus grammar (splitmix64 as a counter-based stream).
struct rng {
  uint64_t state = 0;
  uint64_t next() noexcept { return splitmix64(state++); }
  // Uniform integer in [0, n), n > 0; the modulo bias is irrelevant at these sizes.
  int below(int n) noexcept { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  double uniform() noexcept { return unit_uniform(next()); }
};

}  // namespace gpt

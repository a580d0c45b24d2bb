#pragma once
// Deterministic parameter initialisers: a value is a pure function of (seed, global element
// index), so every rank computes exactly its shard and the model does not depend on sharding.
#include <cmath>
#include <cstdint>
#include <functional>
#include <string_view>

namespace zshard {

using initializer = std::function<float(std::int64_t global_index)>;

// FNV-1a of a name: seeds per-parameter streams.
constexpr std::uint64_t hash_name(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// splitmix64: a good 64-bit mix of a counter; the basis of counter-based random numbers.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1) from a 64-bit value (53 random bits, never 0).
inline double unit_open(std::uint64_t bits) noexcept { return (double(bits >> 11) + 0.5) * 0x1.0p-53; }

namespace init {

inline initializer constant(float value) {
  return [value](std::int64_t) { return value; };
}

// Normal(mean, std) by Box-Muller on two counter-based uniforms.
inline initializer normal(float mean, float stddev, std::uint64_t seed) {
  return [=](std::int64_t i) {
    const std::uint64_t k = seed ^ (static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull);
    const double u1 = unit_open(splitmix64(k));
    const double u2 = unit_open(splitmix64(k ^ 0xd1b54a32d192ed03ull));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    return static_cast<float>(mean + stddev * z);
  };
}

inline initializer uniform(float lo, float hi, std::uint64_t seed) {
  return [=](std::int64_t i) {
    const double u = unit_open(splitmix64(seed ^ (static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull)));
    return static_cast<float>(lo + (hi - lo) * u);
  };
}

}  // namespace init
}  // namespace zshard

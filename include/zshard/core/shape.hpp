#pragma once
// Shapes of parameters: up to four dimensions, stored inline (no allocation on hot paths).
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "zshard/core/error.hpp"

namespace zshard {

class shape {
 public:
  static constexpr int max_rank = 4;

  shape() = default;
  shape(std::initializer_list<std::int64_t> dims) {
    ZSHARD_REQUIRE(
        dims.size() <= max_rank, error_kind::config,
        "a shape has at most " + std::to_string(max_rank) + " dimensions, got " + std::to_string(dims.size()));
    for (std::int64_t d : dims) {
      ZSHARD_REQUIRE(d > 0, error_kind::config, "shape dimensions must be positive, got " + std::to_string(d),
                     "a parameter with no elements cannot be sharded; drop it from the model spec");
      dims_[static_cast<std::size_t>(rank_++)] = d;
    }
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i)
      ZSHARD_REQUIRE(!__builtin_mul_overflow(n, dims_[static_cast<std::size_t>(i)], &n), error_kind::config,
                     "shape " + to_string() + " has more elements than a 64-bit count holds",
                     "check the dimensions: no real tensor is this large");
  }

  int rank() const noexcept { return rank_; }
  std::int64_t operator[](int i) const noexcept { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const noexcept {
    std::int64_t n = rank_ ? 1 : 0;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  std::string to_string() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<std::size_t>(i)]);
    return s + "]";
  }
  friend bool operator==(const shape&, const shape&) = default;

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

}  // namespace zshard

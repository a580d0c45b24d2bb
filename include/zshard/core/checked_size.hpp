#pragma once
// Size arithmetic that cannot wrap: element counts, padding, alignment and byte counts of a
// model with a huge (or mistyped) shape fail with a clear error instead of wrapping to a small
// number that would be allocated, charged (the phantom backend would charge 0 bytes) or
// communicated as if it were right.
#include <cstddef>
#include <cstdint>
#include <string>

#include "zshard/core/error.hpp"

namespace zshard {

namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void size_overflow(const char* what, std::size_t a, const char* op,
                                                                 std::size_t b) {
  throw error(error_kind::config,
              std::string(what) + ": " + std::to_string(a) + op + std::to_string(b) + " overflows size_t",
              "check the shape and settings: no real tensor is this large");
}
}  // namespace detail

// One compare on the hot path (buffers are made per gather); the message is built out of line.
inline std::size_t checked_mul(std::size_t a, std::size_t b, const char* what) {
  std::size_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    detail::size_overflow(what, a, " * ", b);
  return r;
}

inline std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
  std::size_t r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    detail::size_overflow(what, a, " + ", b);
  return r;
}

// Whether elements [offset, offset + n) lie in [0, size), without computing offset + n, which
// wraps for an offset near SIZE_MAX and would let a huge offset pass as a small end.
constexpr bool range_within(std::size_t offset, std::size_t n, std::size_t size) noexcept {
  return n <= size && offset <= size - n;
}

// Such a range in a message, without its (possibly wrapping) end.
inline std::string describe_range(std::size_t offset, std::size_t n) {
  return std::to_string(n) + " element(s) from element " + std::to_string(offset);
}

// n rounded up to a multiple of `multiple` (> 0).
inline std::size_t checked_round_up(std::size_t n, std::size_t multiple, const char* what) {
  const std::size_t rem = n % multiple;
  return rem == 0 ? n : checked_add(n, multiple - rem, what);
}

}  // namespace zshard

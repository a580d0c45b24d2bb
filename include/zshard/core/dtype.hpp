#pragma once
// Element types zshard moves and stores: f32, bf16 and f16, with host conversions that round
// to nearest even and keep NaN and Inf. The 16-bit types are plain bit containers; all math
// happens in float after a conversion, which is what the host reference and the reducer
// (f32 accumulation) need.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "zshard/core/error.hpp"

namespace zshard {

enum class dtype : std::uint8_t { f32, bf16, f16 };

constexpr std::size_t size_of(dtype t) noexcept { return t == dtype::f32 ? 4 : 2; }

constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
  }
  return "?";
}

struct bf16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(bf16, bf16) = default;
};
struct f16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(f16, f16) = default;
};

// ---- bf16: the upper half of an f32 ---------------------------------------------------------
constexpr float to_float(bf16 h) noexcept { return std::bit_cast<float>(std::uint32_t{h.bits} << 16); }

constexpr bf16 to_bf16(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and payload, force quiet
    return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflow carries to Inf
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

// ---- f16: IEEE binary16 (5-bit exponent, 10-bit mantissa, subnormals) -----------------------
constexpr float to_float(f16 h) noexcept {
  const std::uint32_t sign = std::uint32_t{h.bits & 0x8000u} << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  const std::uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

constexpr f16 to_f16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t x = u & 0x7fffffffu;
  if (x > 0x7f800000u)  // NaN: quiet, keep the top payload bits
    return f16{static_cast<std::uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu))};
  if (x >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520 rounds to Inf
  if (x < 0x38800000u) {  // below 2^-14: f16 subnormal or zero
    if (x <= 0x33000000u) return f16{sign};  // <= 2^-25 rounds (ties to even) to zero
    const std::uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (x >> 23);  // value = mant * 2^(exp-150); f16 ulp = 2^-24
    std::uint32_t m = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    m += (rem > half || (rem == half && (m & 1u))) ? 1u : 0u;
    return f16{static_cast<std::uint16_t>(sign | m)};
  }
  std::uint32_t h = (x - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
  const std::uint32_t rem = x & 0x1fffu;
  h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
  return f16{static_cast<std::uint16_t>(sign | h)};
}

// ---- compile-time mapping from C++ types to dtype -------------------------------------------
template <class T> struct dtype_of_t;
template <> struct dtype_of_t<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of_t<bf16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of_t<f16> { static constexpr dtype value = dtype::f16; };
template <class T> inline constexpr dtype dtype_of = dtype_of_t<T>::value;

// Typed conversions for templated loops (one instantiation per element type, no branches).
constexpr float to_float(float v) noexcept { return v; }
template <class T>
constexpr T from_float(float v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(v);
  else
    return to_f16(v);
}

// Reads element i of a buffer of type t as float.
inline float load_as_float(const void* p, dtype t, std::size_t i) noexcept {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(p)[i];
    case dtype::bf16: return to_float(static_cast<const bf16*>(p)[i]);
    case dtype::f16: return to_float(static_cast<const f16*>(p)[i]);
  }
  return 0.0f;
}

// Writes a float into element i of a buffer of type t, rounding to nearest even.
inline void store_from_float(void* p, dtype t, std::size_t i, float v) noexcept {
  switch (t) {
    case dtype::f32: static_cast<float*>(p)[i] = v; break;
    case dtype::bf16: static_cast<bf16*>(p)[i] = to_bf16(v); break;
    case dtype::f16: static_cast<f16*>(p)[i] = to_f16(v); break;
  }
}

// Bulk host conversion between any two dtypes (same dtype is a copy).
inline void convert(const void* src, dtype src_type, void* dst, dtype dst_type, std::size_t n) noexcept {
  if (src_type == dst_type) {
    if (n) std::memcpy(dst, src, n * size_of(src_type));
    return;
  }
  if (src_type == dtype::f32) {
    const auto* s = static_cast<const float*>(src);
    for (std::size_t i = 0; i < n; ++i) store_from_float(dst, dst_type, i, s[i]);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_from_float(dst, dst_type, i, load_as_float(src, src_type, i));
}

}  // namespace zshard

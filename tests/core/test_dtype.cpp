// bf16 / f16 conversions against an independent float64 reference: the nearest representable
// value found by search over the target's value set, ties to the even encoding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "zshard/core/dtype.hpp"

using namespace zshard;

namespace {

// All finite non-negative f16 values in increasing order (encodings 0x0000..0x7bff are monotone).
std::vector<double> positive_f16_values() {
  std::vector<double> v;
  for (std::uint32_t b = 0; b <= 0x7bff; ++b) {
    const int e = int(b >> 10), m = int(b & 0x3ff);
    v.push_back(e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15));
  }
  return v;
}

// Reference f16 rounding of x (finite) by search; returns the encoding.
std::uint16_t reference_f16(double x, const std::vector<double>& values) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const double max_half = 65504.0, overflow_at = 65520.0;  // max + half an ulp (2^4)
  if (a >= overflow_at) return sign | 0x7c00;
  if (a >= max_half) return sign | 0x7bff;
  auto it = std::lower_bound(values.begin(), values.end(), a);
  std::size_t hi = std::size_t(it - values.begin());
  if (values[hi] == a) return std::uint16_t(sign | hi);
  std::size_t lo = hi - 1;
  const double dl = a - values[lo], dh = values[hi] - a;
  std::size_t pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return std::uint16_t(sign | pick);
}

// Reference bf16 rounding: the two bf16 neighbours of x by truncation, nearest in float64.
std::uint16_t reference_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t lo = std::uint16_t(u >> 16);
  const double dx = std::fabs(double(x));
  const double vlo = std::fabs(double(std::bit_cast<float>(std::uint32_t(lo) << 16)));
  const std::uint16_t hi = std::uint16_t(lo + 1);  // next magnitude (may be Inf)
  // past the largest finite bf16 the next step is 2^128 (IEEE rounds to Inf from there)
  const bool hi_is_inf = (hi & 0x7fff) == 0x7f80;
  const double vhi = hi_is_inf ? std::ldexp(1.0, 128) : std::fabs(double(std::bit_cast<float>(std::uint32_t(hi) << 16)));
  const double dl = dx - vlo, dh = vhi - dx;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

}  // namespace

TEST_CASE("bf16: every encoding survives a round trip through f32") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const bf16 h{std::uint16_t(b)};
    const float f = to_float(h);
    const bf16 back = to_bf16(f);
    if (std::isnan(f)) {
      CHECK(std::isnan(to_float(back)));
      CHECK((back.bits & 0x8000) == (b & 0x8000));
    } else {
      CHECK(back.bits == b);
    }
  }
}

TEST_CASE("f16: every encoding survives a round trip through f32, values match float64") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const f16 h{std::uint16_t(b)};
    const float f = to_float(h);
    const int e = int((b >> 10) & 0x1f), m = int(b & 0x3ff);
    const double sign = (b & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f) {
      CHECK((m ? std::isnan(f) : std::isinf(f)));
      if (m) CHECK(std::isnan(to_float(to_f16(f))));
      else CHECK(to_f16(f).bits == b);
      continue;
    }
    const double ref = sign * (e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15));
    CHECK(double(f) == ref);
    CHECK(to_f16(f).bits == b);
  }
}

TEST_CASE("bf16: rounding of random f32 values matches the float64 nearest-even reference") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (!std::isfinite(x)) continue;
    REQUIRE(to_bf16(x).bits == reference_bf16(x));
    ++checked;
  }
  CHECK(checked > 1'900'000);
  // exact ties, both directions
  CHECK(to_bf16(std::bit_cast<float>(0x3f808000u)).bits == 0x3f80);  // tie, even below
  CHECK(to_bf16(std::bit_cast<float>(0x3f818000u)).bits == 0x3f82);  // tie, even above
  CHECK(to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80);   // rounds up to Inf
}

TEST_CASE("f16: rounding of random f32 values matches the float64 nearest-even reference") {
  const auto values = positive_f16_values();
  std::mt19937 rng(99);
  // magnitudes spread over and beyond f16's range, subnormals included
  std::uniform_real_distribution<double> log2mag(-30.0, 18.0);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int i = 0; i < 1'000'000; ++i) {
    const float x = float((coin(rng) ? -1.0 : 1.0) * std::exp2(log2mag(rng)));
    REQUIRE(to_f16(x).bits == reference_f16(double(x), values));
  }
  // ties at every exponent, including subnormal ties and the zero/min-subnormal tie
  for (std::uint32_t b = 0; b < 0x7bff; ++b) {
    const double mid = (values[b] + values[b + 1]) / 2;
    const float x = float(mid);
    if (double(x) != mid) continue;
    REQUIRE(to_f16(x).bits == reference_f16(mid, values));
  }
  CHECK(to_f16(65519.0f).bits == 0x7bff);
  CHECK(to_f16(65520.0f).bits == 0x7c00);
}

TEST_CASE("NaN and Inf are kept, signs are kept") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(to_bf16(inf).bits == 0x7f80);
  CHECK(to_bf16(-inf).bits == 0xff80);
  CHECK(std::isnan(to_float(to_bf16(nan))));
  CHECK(std::isnan(to_float(to_bf16(std::bit_cast<float>(0x7f800001u)))));  // signalling NaN stays NaN
  CHECK(to_f16(inf).bits == 0x7c00);
  CHECK(to_f16(-inf).bits == 0xfc00);
  CHECK(std::isnan(to_float(to_f16(nan))));
  CHECK(std::isnan(to_float(to_f16(std::bit_cast<float>(0x7f800001u)))));
  CHECK(to_f16(-0.0f).bits == 0x8000);
  CHECK(to_bf16(-0.0f).bits == 0x8000);
}

TEST_CASE("bulk convert agrees with element conversions for every dtype pair") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  const std::size_t n = 1000;
  std::vector<float> src(n);
  for (auto& x : src) x = normal(rng);
  for (dtype to : {dtype::f32, dtype::bf16, dtype::f16}) {
    std::vector<std::byte> dst(n * size_of(to));
    convert(src.data(), dtype::f32, dst.data(), to, n);
    for (std::size_t i = 0; i < n; ++i) {
      const float expect = to == dtype::f32 ? src[i] : to == dtype::bf16 ? to_float(to_bf16(src[i])) : to_float(to_f16(src[i]));
      REQUIRE(load_as_float(dst.data(), to, i) == expect);
    }
    for (dtype back : {dtype::f32, dtype::bf16, dtype::f16}) {
      std::vector<std::byte> out(n * size_of(back));
      convert(dst.data(), to, out.data(), back, n);
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<std::byte> one(size_of(back));
        store_from_float(one.data(), back, 0, load_as_float(dst.data(), to, i));
        REQUIRE(load_as_float(out.data(), back, i) == load_as_float(one.data(), back, 0));
      }
    }
  }
}

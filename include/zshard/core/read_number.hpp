#pragma once
// Numbers read from text (schedule files, the tools' and examples' command lines): the whole
// text as one finite number, and counts that are whole and exact in a double ("5e8" included).
#include <cmath>
#include <cstddef>
#include <exception>
#include <optional>
#include <string>

namespace zshard {

// The text as a finite number, or nothing when it is not one (or has anything after it).
inline std::optional<double> read_number(const std::string& text) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != text.size() || !std::isfinite(x)) return std::nullopt;
  return x;
}

// The text as a whole count in [0, 2^53] (exact in a double), or nothing.
inline std::optional<std::size_t> read_count(const std::string& text) {
  const std::optional<double> x = read_number(text);
  if (!x || *x < 0 || *x > 9007199254740992.0 || *x != std::floor(*x)) return std::nullopt;
  return static_cast<std::size_t>(*x);
}

}  // namespace zshard

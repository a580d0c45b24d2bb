#pragma once
// Numbers in messages: the shortest text that reads back as the same value (0.1, not
// 0.100000 or a double's bits), and hashes in hex.
#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>

namespace zshard {

inline std::string format_number(double x) {
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return r.ec == std::errc() ? std::string(buf, r.ptr) : std::string("?");
}

// A float's own shortest text (0.1f reads "0.1", not its double widening "0.10000000149011612").
inline std::string format_number(float x) {
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return r.ec == std::errc() ? std::string(buf, r.ptr) : std::string("?");
}

inline std::string format_hex(std::uint64_t x) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, 16);
  return "0x" + std::string(buf, r.ptr);
}

}  // namespace zshard

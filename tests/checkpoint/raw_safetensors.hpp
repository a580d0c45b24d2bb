#pragma once
// Safetensors files put together byte by byte (an 8-byte length, the JSON header, the data) for
// the reader's tests, and the error opening one gives.
#include <cstdint>
#include <string>

#include "zshard/checkpoint/safetensors_reader.hpp"
#include "zshard/core/error.hpp"

namespace ckpt_test {

// n as 8 little-endian bytes: the header length field.
inline std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[std::size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}

// An 8-byte length (the JSON's own unless `len` is given), the JSON, the data.
inline std::string raw_file(const std::string& json, const std::string& data, std::uint64_t len = ~std::uint64_t{0}) {
  return le64(len == ~std::uint64_t{0} ? json.size() : len) + json + data;
}

// The error opening `path` gives, or "" when it opens.
inline std::string open_error(const std::string& path) {
  try {
    zshard::checkpoint::safetensors_file f(path);
  } catch (const zshard::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace ckpt_test

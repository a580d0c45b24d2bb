#pragma once
// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON, then the data. The JSON maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the data start) and may hold "__metadata__" (string to
// string). parse_header() validates all of it before anyone reads a byte of data: JSON syntax,
// every field's type, the dtype (any the format defines: a file may carry integer, boolean or
// 8-bit float tensors next to the weights), shapes whose byte size matches the offsets and
// cannot overflow, and that the tensors cover the data exactly, as the format requires: sorted
// by offset, the first starts at 0, each where the previous ends, the last at the end of the
// file (no hole, no overlap, no trailing byte). Coverage is what catches a header length that
// is off by a few bytes (the data would otherwise be read shifted). make_header() writes the
// same format (padded with spaces to a multiple of 8 bytes, as the reference writer does).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zshard/checkpoint/json_budget.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

// Every element type of the safetensors format. zshard loads parameters from the three float
// dtypes it computes in (F32, BF16, F16) and writes opaque blobs as U8; the others are parsed
// (their sizes checked) so that a file holding them can be read for the tensors it needs.
enum class file_dtype : std::uint8_t {
  f32, bf16, f16, u8,
  boolean, i8, f8_e5m2, f8_e4m3, f8_e8m0, f8_e4m3fnuz, f8_e5m2fnuz,
  i16, u16, i32, u32, f64, i64, u64, c64,
  f4, f6_e2m3, f6_e3m2,  // packed: 4 or 6 bits per element
};

struct file_dtype_info {
  file_dtype type;
  const char* name;  // as the header spells it
  std::uint8_t bits;
};
inline constexpr file_dtype_info file_dtypes[] = {
    {file_dtype::f32, "F32", 32},          {file_dtype::bf16, "BF16", 16},
    {file_dtype::f16, "F16", 16},          {file_dtype::u8, "U8", 8},
    {file_dtype::boolean, "BOOL", 8},      {file_dtype::i8, "I8", 8},
    {file_dtype::f8_e5m2, "F8_E5M2", 8},   {file_dtype::f8_e4m3, "F8_E4M3", 8},
    {file_dtype::f8_e8m0, "F8_E8M0", 8},   {file_dtype::f8_e4m3fnuz, "F8_E4M3FNUZ", 8},
    {file_dtype::f8_e5m2fnuz, "F8_E5M2FNUZ", 8},
    {file_dtype::i16, "I16", 16},          {file_dtype::u16, "U16", 16},
    {file_dtype::i32, "I32", 32},          {file_dtype::u32, "U32", 32},
    {file_dtype::f64, "F64", 64},          {file_dtype::i64, "I64", 64},
    {file_dtype::u64, "U64", 64},          {file_dtype::c64, "C64", 64},
    {file_dtype::f4, "F4", 4},             {file_dtype::f6_e2m3, "F6_E2M3", 6},
    {file_dtype::f6_e3m2, "F6_E3M2", 6},
};

constexpr const file_dtype_info& info_of(file_dtype t) noexcept {
  for (const auto& i : file_dtypes)
    if (i.type == t) return i;
  return file_dtypes[0];  // unreachable: every enumerator is in the table
}
constexpr std::size_t bits_of(file_dtype t) noexcept { return info_of(t).bits; }
// Bytes per element; 0 for the packed (sub-byte) dtypes, which are never read element-wise.
constexpr std::size_t size_of(file_dtype t) noexcept { return bits_of(t) % 8 == 0 ? bits_of(t) / 8 : 0; }
constexpr const char* safetensors_name(file_dtype t) noexcept { return info_of(t).name; }
inline std::optional<file_dtype> file_dtype_named(std::string_view name) noexcept {
  for (const auto& i : file_dtypes)
    if (name == i.name) return i.type;
  return std::nullopt;
}
constexpr file_dtype file_dtype_of(dtype t) noexcept {
  return t == dtype::f32 ? file_dtype::f32 : t == dtype::bf16 ? file_dtype::bf16 : file_dtype::f16;
}
// The parameter dtype of a file dtype (none for every dtype but F32, BF16 and F16).
inline std::optional<dtype> param_dtype_of(file_dtype t) noexcept {
  switch (t) {
    case file_dtype::f32: return dtype::f32;
    case file_dtype::bf16: return dtype::bf16;
    case file_dtype::f16: return dtype::f16;
    default: return std::nullopt;
  }
}

struct tensor_entry {
  std::string name;
  file_dtype type = file_dtype::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // absolute byte offsets in the file
  std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

struct safetensors_header {
  std::uint64_t data_start = 0;  // 8 + header length
  std::vector<tensor_entry> tensors;
  std::map<std::string, std::string> metadata;
  std::unordered_map<std::string, std::size_t> index;  // name -> position in tensors

  const tensor_entry* find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? nullptr : &tensors[it->second];
  }
};

// A header longer than this is not a real safetensors header (the reference reader refuses
// 100 MB); refusing it early keeps a corrupt length from allocating gigabytes.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

namespace detail {
[[noreturn]] inline void bad_file(const std::string& file, const std::string& what) {
  throw error(error_kind::io, "'" + file + "' is not a valid safetensors file: " + what,
              "the file is corrupt, truncated or of another format; write it again");
}
}  // namespace detail

// Validates the JSON header `json_text` of `file` (named in messages), a file of `file_size`
// bytes.
inline safetensors_header parse_header(const std::string& json_text, std::uint64_t file_size,
                                       const std::string& file) {
  using detail::bad_file;
  using nlohmann::json;
  safetensors_header h;
  h.data_start = 8 + json_text.size();
  if (h.data_start > file_size) bad_file(file, "the header runs past the end of the file");
  if (json_text.empty() || json_text[0] != '{')
    bad_file(file, "the header (" + std::to_string(json_text.size()) + " bytes from byte 8) does not start with '{'");
  // The format nests 3 levels deep (header, tensor, shape): deeper text is refused before a DOM
  // of it is built (json_budget.hpp; a DOM of nested arrays costs ~75 times their text).
  const json_budget depth_only{3, std::numeric_limits<std::uint64_t>::max()};
  if (const auto excess = json_within(json_text, depth_only)) bad_file(file, excess.describe(depth_only, "the header"));
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) bad_file(file, "the header is not valid JSON");
  if (!j.is_object()) bad_file(file, "the header is not a JSON object");
  const std::uint64_t data_bytes = file_size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad_file(file, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad_file(file, "__metadata__ value '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad_file(file, where + " lacks dtype, shape or data_offsets");
    if (!v["dtype"].is_string()) bad_file(file, where + ": dtype is not a string");
    const std::string dt = v["dtype"].get<std::string>();
    tensor_entry e;
    e.name = name;
    const auto type = file_dtype_named(dt);
    if (!type) bad_file(file, where + " has dtype '" + dt + "', which the safetensors format does not define");
    e.type = *type;
    if (!v["shape"].is_array()) bad_file(file, where + ": shape is not an array");
    // element count and bit count, refused where they overflow (a wrapped product could match
    // any offsets, 0 included)
    std::uint64_t numel = 1, bits = 0;
    bool overflow = false;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
        bad_file(file, where + ": shape has a bad dimension " + d.dump());
      overflow = __builtin_mul_overflow(numel, d.get<std::uint64_t>(), &numel) || overflow;
      e.shape.push_back(d.get<std::int64_t>());
    }
    overflow = __builtin_mul_overflow(numel, std::uint64_t{bits_of(e.type)}, &bits) || overflow;
    if (overflow)
      bad_file(file, where + ": shape " + v["shape"].dump() + " of " + dt +
                         " overflows (more bytes than any file holds)");
    if (bits % 8 != 0)
      bad_file(file, where + ": " + std::to_string(numel) + " elements of " + dt + " (" +
                         std::to_string(bits_of(e.type)) + " bits each) are not a whole number of bytes");
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad_file(file, where + ": data_offsets is not two non-negative integers");
    const auto b = off[0].get<std::uint64_t>(), en = off[1].get<std::uint64_t>();
    const std::string offsets = "data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "]";
    if (b > en) bad_file(file, where + ": " + offsets + " has begin > end");
    if (en > data_bytes)
      bad_file(file, where + ": " + offsets + " ends past the " + std::to_string(data_bytes) +
                         " data bytes the file holds (truncated?)");
    if (en - b != bits / 8)
      bad_file(file, where + ": " + offsets + " holds " + std::to_string(en - b) + " bytes but its shape " +
                         v["shape"].dump() + " and dtype " + dt + " need " + std::to_string(bits / 8));
    e.begin = h.data_start + b;
    e.end = h.data_start + en;
    h.tensors.push_back(std::move(e));
  }
  // exact coverage of the data by the tensors, in offset order
  std::vector<const tensor_entry*> by_offset;
  for (const auto& e : h.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  auto span = [&](const tensor_entry* t) {
    return "'" + t->name + "' (data_offsets [" + std::to_string(t->begin - h.data_start) + ", " +
           std::to_string(t->end - h.data_start) + "])";
  };
  std::uint64_t at = h.data_start;
  const tensor_entry* prev = nullptr;
  for (const tensor_entry* t : by_offset) {
    if (t->begin > at)
      bad_file(file, "data bytes [" + std::to_string(at - h.data_start) + ", " + std::to_string(t->begin - h.data_start) +
                         ") belong to no tensor: a hole " + (prev ? "between tensor " + span(prev) + " and " : "before ") +
                         "tensor " + span(t));
    if (t->begin < at) bad_file(file, "tensors " + span(prev) + " and " + span(t) + " overlap");
    at = t->end;
    prev = t;
  }
  if (at != file_size)
    bad_file(file, std::to_string(file_size - at) + " trailing data bytes after " +
                       (prev ? "the last tensor " + span(prev) : std::string("the header (no tensors)")) +
                       ": the tensors must cover the " + std::to_string(data_bytes) +
                       " data bytes exactly (a wrong header length shifts every tensor)");
  for (std::size_t i = 0; i < h.tensors.size(); ++i) h.index.emplace(h.tensors[i].name, i);
  return h;
}

// What a writer lays out: tensors in the order given, back to back.
struct planned_tensor {
  std::string name;
  file_dtype type;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes() const noexcept {
    std::uint64_t n = bits_of(type);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n / 8;
  }
  bool whole_bytes() const noexcept {
    std::uint64_t n = bits_of(type);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n % 8 == 0;
  }
};

// The 8-byte length and the JSON header (padded with spaces to a multiple of 8), and the
// data offsets it assigns (relative to the data start, in `tensors` order).
inline std::string make_header(const std::vector<planned_tensor>& tensors,
                               const std::map<std::string, std::string>& metadata, std::vector<std::uint64_t>* offsets) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    ZSHARD_REQUIRE(!t.name.empty() && t.name != "__metadata__" && !j.contains(t.name), error_kind::usage,
                   "safetensors writer: tensor name '" + t.name + "' is empty, reserved or used twice");
    ZSHARD_REQUIRE(t.whole_bytes(), error_kind::usage,
                   "safetensors writer: tensor '" + t.name + "' of " + safetensors_name(t.type) +
                       " is not a whole number of bytes");
    if (offsets) offsets->push_back(at);
    j[t.name] = {{"dtype", safetensors_name(t.type)}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes()}}};
    at += t.bytes();
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

inline std::uint64_t decode_header_length(const unsigned char (&b)[8]) noexcept {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

}  // namespace zshard::checkpoint

#pragma once
// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON, then the data. The JSON maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the data start) and may hold "__metadata__" (string to
// string). parse_header() validates all of it before anyone reads a byte of data: JSON syntax,
// every field's type, known dtypes, shapes whose element count matches the bytes, offsets
// inside the file, no two tensors overlapping. make_header() writes the same format (padded
// with spaces to a multiple of 8 bytes, as the reference writer does).
#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

// Element types zshard reads and writes in safetensors files: the three parameter dtypes, and
// bytes for opaque blobs (the user's state in a checkpoint).
enum class file_dtype : std::uint8_t { f32, bf16, f16, u8 };

constexpr std::size_t size_of(file_dtype t) noexcept { return t == file_dtype::f32 ? 4 : t == file_dtype::u8 ? 1 : 2; }
constexpr const char* safetensors_name(file_dtype t) noexcept {
  switch (t) {
    case file_dtype::f32: return "F32";
    case file_dtype::bf16: return "BF16";
    case file_dtype::f16: return "F16";
    case file_dtype::u8: return "U8";
  }
  return "?";
}
constexpr file_dtype file_dtype_of(dtype t) noexcept {
  return t == dtype::f32 ? file_dtype::f32 : t == dtype::bf16 ? file_dtype::bf16 : file_dtype::f16;
}
// The parameter dtype of a file dtype (u8 has none).
inline std::optional<dtype> param_dtype_of(file_dtype t) noexcept {
  switch (t) {
    case file_dtype::f32: return dtype::f32;
    case file_dtype::bf16: return dtype::bf16;
    case file_dtype::f16: return dtype::f16;
    case file_dtype::u8: return std::nullopt;
  }
  return std::nullopt;
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

// Validates the JSON header of `file` (for messages) of `file_size` bytes whose header is
// `header_len` bytes long.
inline safetensors_header parse_header(const std::string& json_text, std::uint64_t file_size,
                                       const std::string& file) {
  using detail::bad_file;
  using nlohmann::json;
  safetensors_header h;
  h.data_start = 8 + json_text.size();
  if (h.data_start > file_size) bad_file(file, "the header runs past the end of the file");
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
    if (dt == "F32") e.type = file_dtype::f32;
    else if (dt == "BF16") e.type = file_dtype::bf16;
    else if (dt == "F16") e.type = file_dtype::f16;
    else if (dt == "U8") e.type = file_dtype::u8;
    else
      throw error(error_kind::io, "'" + file + "': " + where + " has dtype " + dt + ", which zshard does not load",
                  "convert the tensor to F32, BF16 or F16 (e.g. tensor.float() in PyTorch) before saving");
    if (!v["shape"].is_array()) bad_file(file, where + ": shape is not an array");
    std::uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) bad_file(file, where + ": shape has a bad dimension");
      const auto dim = static_cast<std::uint64_t>(d.get<std::int64_t>());
      if (dim != 0 && numel > (std::uint64_t{1} << 62) / dim) bad_file(file, where + ": shape overflows");
      numel *= dim;
      e.shape.push_back(d.get<std::int64_t>());
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad_file(file, where + ": data_offsets is not two non-negative integers");
    const auto b = off[0].get<std::uint64_t>(), en = off[1].get<std::uint64_t>();
    if (b > en) bad_file(file, where + ": data_offsets begin > end");
    if (en > data_bytes)
      bad_file(file, where + " ends at data byte " + std::to_string(en) + " but the file holds only " +
                         std::to_string(data_bytes) + " data bytes (truncated?)");
    if (en - b != numel * size_of(e.type))
      bad_file(file, where + " has " + std::to_string(en - b) + " bytes but its shape and dtype need " +
                         std::to_string(numel * size_of(e.type)));
    e.begin = h.data_start + b;
    e.end = h.data_start + en;
    h.tensors.push_back(std::move(e));
  }
  std::vector<const tensor_entry*> by_offset;
  for (const auto& e : h.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      bad_file(file, "tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap");
  for (std::size_t i = 0; i < h.tensors.size(); ++i) h.index.emplace(h.tensors[i].name, i);
  return h;
}

// What a writer lays out: tensors in the order given, back to back.
struct planned_tensor {
  std::string name;
  file_dtype type;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes() const noexcept {
    std::uint64_t n = size_of(type);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
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

#pragma once
// The layout a safetensors file records for its 2-D tensors: which ones hold the transpose of
// the parameter as the model that wrote the file registered it (param_options::file_transposed:
// a weight kept as (in, out), written as torch's (out, in)). Exports write it in the header's
// "__metadata__" under "zshard_transposed": a JSON array of those tensors' names, as a string
// ("[]" when none), so that the key's presence says the file records its layout. A loader
// compares it with the loading model's registration (pretrained.hpp): a square weight would
// otherwise load transposed without a word (a non-square one is refused by its shape). A file
// without the key (written by other tools) records nothing, and is read as the model says.
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "zshard/checkpoint/json_budget.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

inline constexpr const char* transposed_metadata_key = "zshard_transposed";

// The metadata value for the tensors named `transposed`.
inline std::string transposed_metadata(const std::vector<std::string>& transposed) {
  return nlohmann::json(transposed).dump();
}

// The tensors `metadata` (a file's "__metadata__") records as transposed, or none when it records
// no layout (no key). A value that is not a JSON array of strings is an error naming `file`.
inline std::optional<std::set<std::string>> transposed_tensors(const std::map<std::string, std::string>& metadata,
                                                               const std::string& file) {
  const auto it = metadata.find(transposed_metadata_key);
  if (it == metadata.end()) return std::nullopt;
  // one level (an array of names) before a DOM of it is built (json_budget.hpp)
  const bool flat = !json_within(it->second, {1, std::numeric_limits<std::uint64_t>::max()});
  const nlohmann::json j = flat ? nlohmann::json::parse(it->second, nullptr, false) : nlohmann::json();
  std::set<std::string> out;
  bool ok = flat && !j.is_discarded() && j.is_array();
  for (std::size_t i = 0; ok && i < j.size(); ++i) {
    ok = j[i].is_string();
    if (ok) out.insert(j[i].get<std::string>());
  }
  if (!ok)
    throw error(error_kind::io,
                "'" + file + "' is not a valid safetensors file: its metadata \"" + transposed_metadata_key +
                    "\" is not a JSON array of tensor names",
                "the file is damaged; export it again");
  return out;
}

}  // namespace zshard::checkpoint

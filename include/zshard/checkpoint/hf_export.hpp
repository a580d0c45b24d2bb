#pragma once
// export_hf(engine, dir): the model as a Hugging Face checkpoint directory that transformers
// loads unchanged (AutoModelForCausalLM.from_pretrained(dir)), collective: config.json, and the
// weights under the checkpoint's names (an hf_name_table, hf_names.hpp) in the dtype asked for,
// in shards of at most max_shard_bytes as save_pretrained writes them: model.safetensors when
// they fit in one, else model-0000k-of-0000n.safetensors and model.safetensors.index.json.
// Shapes are the model's (zshard's Llama keeps torch's (out, in)); a parameter registered with
// param_options::file_transposed is written as its transpose, as export_engine does.
//
// The writing is export_engine's (export.hpp): every rank writes the elements it owns straight
// into the shards, no gathers, through one bounded chunk; ranks meet through marker files. The
// directory is built next to `dir` and renamed into place: it appears complete or not at all.
// `dir` must not exist, or be an empty directory: nothing is overwritten.
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "zshard/checkpoint/export.hpp"
#include "zshard/checkpoint/hf_checkpoint.hpp"
#include "zshard/checkpoint/hf_names.hpp"

namespace zshard::checkpoint {

struct hf_export_options {
  hf_name_table names = llama_hf_names();
  dtype type = dtype::f32;                            // f32, bf16 or f16
  std::uint64_t max_shard_bytes = 5'000'000'000;      // save_pretrained's "5GB"
  nlohmann::json config = nlohmann::json::object();   // written as config.json (hf_llama_config::to_json)
  state_field source = state_field::working;          // or the f32 masters of trainable parameters
  std::size_t chunk_bytes = std::size_t{64} << 20;
  std::chrono::milliseconds io_timeout = std::chrono::minutes(30);
  io_hook hook{};
};

namespace detail {
// The shards: parameters in model order, a new shard whenever the next tensor would take the
// current one past max_shard_bytes (a tensor larger than that gets a shard of its own).
inline std::vector<export_file> plan_hf_shards(const manifest& m, const hf_export_options& o, const std::string& where) {
  std::vector<export_file> shards;
  std::uint64_t in_shard = 0;
  std::set<std::string> taken;
  std::vector<std::string> unnamed;
  for (param_id p = 0; p < m.params.size(); ++p) {
    const auto name = o.names.to_file(m.params[p].name);
    if (!name) {
      unnamed.push_back("'" + m.params[p].name + "'");
      continue;
    }
    if (!taken.insert(*name).second)
      throw error(error_kind::usage, "export to '" + where + "': two parameters map to the file name '" + *name + "'",
                  "give each parameter its own row in the hf_name_table");
    const std::uint64_t bytes = m.params[p].numel * size_of(o.type);
    if (shards.empty() || (in_shard > 0 && in_shard + bytes > o.max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().params.push_back(p);
    shards.back().names.push_back(*name);
    in_shard += bytes;
  }
  if (!unnamed.empty()) {
    std::string list;
    for (const auto& u : unnamed) list += (list.empty() ? "" : ", ") + u;
    throw error(error_kind::usage, "export to '" + where + "': no row of the name table names " + list,
                "add a row for each (hf_name_table::add), so that the checkpoint holds every parameter");
  }
  return shards;
}

inline std::string hf_shard_name(std::size_t k, std::size_t n) {
  if (n == 1) return hf_single_name;
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}
}  // namespace detail

template <class Engine>
void export_hf(Engine& eng, std::string dir, const hf_export_options& o = {}) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();  // "out/": the directory out
  const export_options eo{.type = o.type, .source = o.source, .chunk_bytes = o.chunk_bytes, .io_timeout = o.io_timeout,
                          .hook = o.hook};
  check_export_options(eo);
  ZSHARD_REQUIRE(o.max_shard_bytes > 0, error_kind::usage, "hf_export_options::max_shard_bytes must be positive");
  const io_hook* hook = o.hook ? &o.hook : nullptr;
  const manifest m = describe_engine(eng);
  const std::string tmp = dir + ".zshard-export.tmp", staged = tmp + "/checkpoint";
  std::vector<detail::export_file> shards = detail::plan_hf_shards(m, o, dir);
  nlohmann::ordered_json index;
  std::uint64_t total_bytes = 0, total_params = 0;
  std::map<std::string, std::string> weight_map;  // sorted by tensor name, as save_pretrained writes it
  for (std::size_t k = 0; k < shards.size(); ++k) {
    shards[k].path = staged + "/" + detail::hf_shard_name(k, shards.size());
    for (std::size_t i = 0; i < shards[k].params.size(); ++i) {
      weight_map[shards[k].names[i]] = detail::hf_shard_name(k, shards.size());
      total_bytes += m.params[shards[k].params[i]].numel * size_of(o.type);
      total_params += m.params[shards[k].params[i]].numel;
    }
  }
  index["metadata"] = {{"total_parameters", total_params}, {"total_size", total_bytes}};
  index["weight_map"] = weight_map;
  detail::export_files(
      eng, m, tmp, shards, eo, "export to '" + dir + "'",
      [&] {
        namespace fs = std::filesystem;
        std::error_code ec;
        if (fs::exists(fs::symlink_status(dir, ec)) &&
            (!fs::is_directory(fs::symlink_status(dir, ec)) || !fs::is_empty(dir, ec)))
          throw error(error_kind::io, "export directory '" + dir + "' exists and is not an empty directory",
                      "name a new directory: an export overwrites nothing");
      },
      [&] {
        if (shards.size() > 1) write_small_file(staged + "/" + hf_index_name, index.dump(2) + "\n", hook);
        if (!o.config.empty()) write_small_file(staged + "/config.json", o.config.dump(2) + "\n", hook);
        sync_directory(staged, hook);
        std::error_code ec;
        if (std::filesystem::is_directory(dir, ec)) remove_path(dir, hook);  // empty (checked above)
        rename_path(staged, dir, hook);
        const auto parent = std::filesystem::path(dir).parent_path().string();
        sync_directory(parent.empty() ? "." : parent, hook);
      },
      false);  // transformers' files as it writes them: no zshard layout key (file_layout.hpp)
}

}  // namespace zshard::checkpoint

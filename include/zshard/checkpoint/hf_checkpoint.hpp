#pragma once
// load_hf(engine, dir): a Hugging Face checkpoint directory into an engine, collective. The
// directory holds config.json (read_hf_llama_config: the caller builds its model from it) and
// the weights as transformers writes them: model.safetensors.index.json and the shards its
// weight_map names (model-0000k-of-0000n.safetensors), or one model.safetensors.
//
// Before a byte of data is read, every rank checks the directory (and all ranks agree on the
// outcome, agreement.hpp): each shard the index names must be a plain file name of that
// directory (directory_handle.hpp: no path, no "..", not absolute), present, a regular file
// (no FIFO, no device) and not a symbolic link (the Hugging Face cache's snapshot folders are
// links into its blobs/ folder: download with --local-dir, copy the folder with `cp -rL`, or set
// hf_load_options::follow_links). A shard missing from disk is named with the tensors the
// index puts in it. Then load_pretrained (pretrained.hpp) does the reading: names
// through an hf_name_table (hf_names.hpp), every tensor matched first (missing, unexpected,
// wrong shape or a dtype other than F32/BF16/F16: one error naming each), each shard's header
// read once, each rank reading only the byte ranges of its own shards through one bounded chunk.
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/directory_handle.hpp"
#include "zshard/checkpoint/file_io.hpp"
#include "zshard/checkpoint/hf_config.hpp"
#include "zshard/checkpoint/hf_names.hpp"
#include "zshard/checkpoint/pretrained.hpp"

namespace zshard::checkpoint {

inline constexpr const char* hf_index_name = "model.safetensors.index.json";
inline constexpr const char* hf_single_name = "model.safetensors";

struct hf_load_options {
  hf_name_table names = llama_hf_names();
  std::size_t chunk_bytes = std::size_t{64} << 20;  // host memory each rank reads through
  // A shard that is a symbolic link is refused unless this is set: then links are followed
  // (the Hugging Face cache's snapshot folders hold links into its blobs/ folder).
  bool follow_links = false;
};

namespace detail {
[[noreturn]] inline void bad_hf_dir(const std::string& what, const std::string& hint) {
  throw error(error_kind::io, what, hint);
}

// `name` (as an index spells it) is a file directly in `dir`: present, a regular file, and
// not a link unless links are followed (directory_handle.hpp's rules for names read from files).
inline void check_hf_shard(const directory_handle& dir, const std::string& name, const std::string& index,
                           const std::vector<std::string>& tensors, bool follow_links) {
  const std::string where = "'" + index + "' names the shard '" + name + "'";
  if (!is_plain_name(name))
    bad_hf_dir(where + ", which is not a file name of the checkpoint's directory '" + dir.path() + "'",
               "an index names the shard files next to it (e.g. model-00001-of-00004.safetensors): "
               "no paths, no '..'");
  struct stat st {};
  if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    const int err = errno;
    std::string some;
    for (std::size_t i = 0; i < tensors.size() && i < 3; ++i) some += (i ? ", '" : "'") + tensors[i] + "'";
    if (tensors.size() > 3) some += " and " + std::to_string(tensors.size() - 3) + " more";
    if (err == ENOENT)
      bad_hf_dir(where + (some.empty() ? "" : " (holding " + some + ")") + ", which is missing from '" + dir.path() +
                     "'",
                 "the download is incomplete: fetch every shard the index lists");
    throw_io("cannot read", dir.path() + "/" + name, err);
  }
  if (S_ISLNK(st.st_mode) && !follow_links)
    bad_hf_dir(where + ", which is a symbolic link: a checkpoint's files are read only from inside its directory",
               "copy the checkpoint with its files (cp -rL), download it with huggingface-cli download "
               "--local-dir DIR, or, for the Hugging Face cache (its snapshot folders hold links into blobs/), "
               "set hf_load_options::follow_links");
  dir.open_file(name);  // a regular file (no FIFO, no device), opened without blocking: else refused, named
}
}  // namespace detail

// The weights file load_pretrained opens for the checkpoint directory `dir` (its index, or
// its single model.safetensors), after checking every shard as above. Also takes the path
// of an index or of a .safetensors file directly.
inline std::string checked_hf_weights(const std::string& path, bool follow_links = false) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string dir = path, index;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / hf_index_name, ec)) index = (fs::path(path) / hf_index_name).string();
    else if (fs::exists(fs::path(path) / hf_single_name, ec)) index = "";
    else
      detail::bad_hf_dir("'" + path + "' holds neither " + hf_index_name + " nor " + hf_single_name,
                         "name a Hugging Face checkpoint directory (config.json and the weights)");
  } else {
    dir = fs::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) index = path;
  }
  const directory_handle d = directory_handle::open(dir, follow_links);
  if (index.empty()) {  // one file
    const std::string name = fs::is_directory(path, ec) ? hf_single_name : fs::path(path).filename().string();
    detail::check_hf_shard(d, name, path, {}, follow_links);
    return dir + "/" + name;
  }
  const nlohmann::json j = nlohmann::json::parse(read_small_file(index), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    detail::bad_hf_dir("'" + index + "' is not a safetensors index: no \"weight_map\" object",
                       "write the index again (save_pretrained), or name the model's *.safetensors.index.json");
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      detail::bad_hf_dir("'" + index + "': weight_map entry '" + it.key() + "' is not a file name",
                         "write the index again (save_pretrained)");
    by_file[it.value().get<std::string>()].push_back(it.key());
  }
  for (const auto& [file, tensors] : by_file) detail::check_hf_shard(d, file, index, tensors, follow_links);
  return index;
}

// Collective: the checkpoint in `path` (a directory, an index or a .safetensors file) into
// eng's parameters, named through o.names; a parameter no row names is looked up under its
// own name. Returns load_pretrained's report.
template <class Engine>
pretrained_report load_hf(Engine& eng, const std::string& path, const hf_load_options& o = {}) {
  std::string weights;
  agree(eng, "loading the Hugging Face checkpoint '" + path + "'",
        [&] { weights = checked_hf_weights(path, o.follow_links); });
  pretrained_options po;
  po.name_map = [&](const std::string& n) { return o.names.to_file(n).value_or(n); };
  po.ignorable = [&](const std::string& n) { return o.names.is_ignored(n); };
  po.chunk_bytes = o.chunk_bytes;
  return load_pretrained(eng, weights, po);
}

}  // namespace zshard::checkpoint

#pragma once
// Reading safetensors files by byte range. A safetensors_file parses and validates its header
// on open (safetensors_format.hpp) and then reads any element range of any tensor with pread,
// so a rank reads its own shard of a parameter and nothing else. A safetensors_source is one
// file or the set of files a Hugging Face `*.safetensors.index.json` names ("weight_map":
// tensor name -> file, relative to the index), looked up by tensor name. An index names files
// next to it and nowhere else (a name with '/' or "..": refused before anything is opened);
// every file must be a regular one, opened without blocking (a FIFO is refused, not waited on);
// links are followed (the Hugging Face cache keeps a snapshot's files as links into blobs/).
//
// Nothing here allocates data buffers: callers read into their own chunk (bounded, counted in
// a ledger; see host_staging.hpp).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zshard/checkpoint/directory_handle.hpp"
#include "zshard/checkpoint/file_io.hpp"
#include "zshard/checkpoint/safetensors_format.hpp"

namespace zshard::checkpoint {

class safetensors_file {
 public:
  // `hook` (may be null; tests) sees every read of the file and must outlive it.
  explicit safetensors_file(const std::string& path, const io_hook* hook = nullptr)
      : safetensors_file(file_handle::read_only(path, hook)) {}
  // An open file (a regular one: file_handle::read_only, directory_handle::open_file), whose
  // size the caller may have checked against what it expects before anything is read.
  explicit safetensors_file(file_handle f) : file_(std::move(f)) {
    const std::string& path = file_.path();
    size_ = file_.size();
    if (size_ < 8)
      detail::bad_file(path, "it has " + std::to_string(size_) + " bytes, fewer than the 8-byte header length");
    unsigned char len[8];
    file_.read_at(0, len, 8);
    const std::uint64_t n = decode_header_length(len);
    if (n > max_header_bytes || n > size_ - 8)
      detail::bad_file(path, "its header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size_) +
                                 " bytes) or the 100 MB limit");
    if (n < 2) detail::bad_file(path, "its header length " + std::to_string(n) + " is too short for a JSON object");
    std::string text(static_cast<std::size_t>(n), '\0');
    file_.read_at(8, text.data(), text.size());
    header_ = parse_header(text, size_, path);
    header_text_ = std::move(text);
  }

  const std::string& path() const noexcept { return file_.path(); }
  std::uint64_t size() const noexcept { return size_; }
  const safetensors_header& header() const noexcept { return header_; }
  const std::string& header_text() const noexcept { return header_text_; }
  const tensor_entry* find(const std::string& name) const { return header_.find(name); }

  // Elements [first, first + n) of tensor t into dst (in the file's dtype).
  void read(const tensor_entry& t, std::uint64_t first, std::uint64_t n, void* dst) const {
    const std::uint64_t w = size_of(t.type);
    ZSHARD_REQUIRE(w != 0, error_kind::usage,
                   "tensor '" + t.name + "' of '" + path() + "' has the packed dtype " + safetensors_name(t.type) +
                       ", which is not read element by element");
    ZSHARD_REQUIRE(n <= t.numel() && first <= t.numel() - n, error_kind::usage,
                   "read of " + std::to_string(n) + " elements from element " + std::to_string(first) + " of tensor '" +
                       t.name + "' which has " + std::to_string(t.numel()));
    file_.read_at(t.begin + first * w, dst, static_cast<std::size_t>(n * w));
  }
  // Raw bytes (checksums over a whole file).
  void read_bytes(std::uint64_t offset, void* dst, std::size_t n) const { file_.read_at(offset, dst, n); }

 private:
  file_handle file_;
  std::uint64_t size_ = 0;
  safetensors_header header_;
  std::string header_text_;
};

// One file, or every file of an index, by tensor name.
class safetensors_source {
 public:
  struct located {
    const safetensors_file* file = nullptr;
    const tensor_entry* tensor = nullptr;
  };

  // `path`: a .safetensors file, or a *.index.json next to the files it names.
  explicit safetensors_source(const std::string& path) {
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
      open_index(path);
    else
      add_file(path, nullptr);
  }

  // Every tensor in the source, in file order.
  std::vector<located> tensors() const {
    std::vector<located> out;
    for (const auto& f : files_)
      for (const auto& t : f->header().tensors) out.push_back({f.get(), &t});
    return out;
  }
  located find(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? located{} : it->second;
  }
  std::size_t file_count() const noexcept { return files_.size(); }

 private:
  void open_index(const std::string& path) {
    using nlohmann::json;
    json j = json::parse(read_small_file(path), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw error(error_kind::io, "'" + path + "' is not a safetensors index: no \"weight_map\" object",
                  "name a .safetensors file, or the model's *.safetensors.index.json");
    std::map<std::string, std::vector<std::string>> by_file;  // file -> tensors the index puts there
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw error(error_kind::io, "'" + path + "': weight_map entry '" + it.key() + "' is not a file name");
      const std::string file = it.value().get<std::string>();
      if (!is_plain_name(file))  // before anything is opened: the index names files next to it, nowhere else
        throw error(error_kind::io,
                    "'" + path + "': weight_map puts tensor '" + it.key() + "' in '" + file +
                        "', which is not a file name in the index's directory (no '/', not '..')",
                    "an index names the files next to it; fix the index");
      by_file[file].push_back(it.key());
    }
    // The files next to the index, opened relative to its directory; links are followed (the
    // Hugging Face cache keeps each file of a snapshot as a link into its blobs/).
    const std::string parent = std::filesystem::path(path).parent_path().string();
    const directory_handle dir = directory_handle::open(parent.empty() ? "." : parent, true);
    for (const auto& [file, names] : by_file) add_file(dir.open_file(file), &names);
  }

  // `expected`: the tensors an index says the file holds; each must be there.
  void add_file(const std::string& path, const std::vector<std::string>* expected) {
    add_file(file_handle::read_only(path), expected);
  }
  void add_file(file_handle fh, const std::vector<std::string>* expected) {
    const std::string path = fh.path();
    files_.push_back(std::make_unique<safetensors_file>(std::move(fh)));
    const safetensors_file& f = *files_.back();
    for (const auto& t : f.header().tensors) {
      if (expected && std::find(expected->begin(), expected->end(), t.name) == expected->end()) continue;
      auto [it, fresh] = where_.emplace(t.name, located{&f, &t});
      if (!fresh)
        throw error(error_kind::io,
                    "tensor '" + t.name + "' is in both '" + it->second.file->path() + "' and '" + path + "'",
                    "fix the index so that each tensor lives in one file");
    }
    if (expected)
      for (const auto& name : *expected)
        if (!f.find(name))
          throw error(error_kind::io, "the index puts tensor '" + name + "' in '" + path + "', which does not hold it",
                      "the index and the files disagree: download or write them again");
  }

  std::vector<std::unique_ptr<safetensors_file>> files_;
  std::map<std::string, located> where_;
};

}  // namespace zshard::checkpoint

#pragma once
// The layout of a directory of checkpoints, and the operations that keep it consistent:
//
//   DIR/step-0000000100/         one complete checkpoint (manifest.json, rank files, user state)
//   DIR/step-0000000200/
//   DIR/latest                   the name of the newest complete checkpoint, one line
//   DIR/.step-0000000300.tmp/    a save in progress (or one that crashed: removed by the next save)
//   DIR/.step-0000000100.deleting.tmp/  a checkpoint being removed by keep_last rotation (or
//                                the leftover of a crash during it: removed by the next save)
//
// A checkpoint directory appears only by rename(2) of a complete, fsynced temporary directory,
// and disappears only by rename(2) to a hidden name before any of its files is removed; `latest`
// is replaced by rename(2) of a fsynced temporary file. A crash at any point thus leaves every
// listed checkpoint complete, and the previous checkpoint and the previous `latest` intact.
// Saving the same step twice gives the second one a suffix (step-0000000100.1) instead of
// touching the first.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "zshard/checkpoint/directory_handle.hpp"
#include "zshard/checkpoint/file_io.hpp"
#include "zshard/checkpoint/manifest.hpp"

namespace zshard::checkpoint {

inline constexpr const char* latest_file = "latest";

struct checkpoint_name {
  std::int64_t step = 0;
  int suffix = 0;
  std::string name;
  friend bool operator<(const checkpoint_name& a, const checkpoint_name& b) {
    return a.step != b.step ? a.step < b.step : a.suffix < b.suffix;
  }
};

// "step-0000000100" or "step-0000000100.2"; nothing else.
inline bool parse_checkpoint_name(const std::string& s, checkpoint_name& out) {
  if (s.size() < 6 || s.compare(0, 5, "step-") != 0) return false;
  std::size_t i = 5, digits = 0;
  std::int64_t step = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) step = step * 10 + (s[i++] - '0'), ++digits;
  if (digits == 0 || digits > 18) return false;
  int suffix = 0;
  if (i < s.size()) {
    if (s[i++] != '.' || i == s.size()) return false;
    std::size_t sd = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) suffix = suffix * 10 + (s[i++] - '0'), ++sd;
    if (i != s.size() || sd == 0 || sd > 6) return false;
  }
  out = {step, suffix, s};
  return true;
}

// Complete checkpoints in dir, oldest first: step-* directories with a manifest (which a save
// writes last; a directory without one is not a checkpoint, whoever left it there).
inline std::vector<checkpoint_name> list_checkpoints(const std::string& dir) {
  std::vector<checkpoint_name> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    checkpoint_name n;
    std::error_code ec2;
    if (e.is_directory(ec2) && parse_checkpoint_name(e.path().filename().string(), n) &&
        std::filesystem::is_regular_file(e.path() / manifest_file_name, ec2))
      out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A fresh name for a checkpoint of `step` in dir.
inline std::string new_checkpoint_name(const std::string& dir, std::int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%010lld", static_cast<long long>(step));
  std::string name = buf;
  for (int k = 1; std::filesystem::exists(dir + "/" + name); ++k) name = std::string(buf) + "." + std::to_string(k);
  return name;
}

// Leftovers of saves that did not complete.
inline void remove_stale_temporaries(const std::string& dir, const io_hook* hook = nullptr) {
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 5 && n[0] == '.' && n.compare(n.size() - 4, 4, ".tmp") == 0) stale.push_back(e.path().string());
  }
  for (const auto& p : stale) try {
      remove_tree(p, hook);
    } catch (const error&) {  // not in the way of this save: tried again by the next
    }
}

// Points `latest` at name, atomically.
inline void set_latest(const std::string& dir, const std::string& name, const io_hook* hook = nullptr) {
  const std::string tmp = dir + "/." + std::string(latest_file) + ".tmp";
  write_small_file(tmp, name + "\n", hook);
  rename_path(tmp, dir + "/" + latest_file, hook);
  sync_directory(dir, hook);
}

// The checkpoint `path` names, open: a checkpoint directory itself (it has a manifest), or a
// directory of checkpoints whose `latest` names one. `path` is the caller's (links in it are
// followed); inside it nothing is: `latest` must be a regular file naming a step-* directory
// that is not a symbolic link, and every file of the checkpoint is then opened relative to the
// returned handle, without following links or blocking (directory_handle.hpp).
inline directory_handle open_checkpoint(const std::string& path, const io_hook* hook = nullptr) {
  directory_handle top;
  try {
    top = directory_handle::open(path, false);
  } catch (const error& e) {
    throw error(error_kind::io, "no checkpoint at '" + path + "': " + e.message(),
                "name a directory that a save wrote to, or one of its step-* directories");
  }
  if (top.holds(manifest_file_name)) return top;
  if (top.holds(latest_file)) {
    std::string name = top.read_small(latest_file, 4096, hook);
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
    checkpoint_name n;
    if (!parse_checkpoint_name(name, n))
      throw error(error_kind::io, "'" + path + "/latest' does not name a checkpoint ('" + name + "')",
                  "point it at an existing step-* directory, or load that directory directly");
    directory_handle step = top.subdirectory(name);
    if (!step.holds(manifest_file_name))
      throw error(error_kind::io, "'" + path + "/latest' names '" + name + "', which has no manifest.json",
                  "load one of the step-* directories directly");
    return step;
  }
  throw error(error_kind::io, "no checkpoint at '" + path + "' (neither manifest.json nor latest there)",
              "name a directory that a save wrote to, or one of its step-* directories");
}

// The path of the checkpoint `path` names (open_checkpoint).
inline std::string resolve_checkpoint(const std::string& path, const io_hook* hook = nullptr) {
  return open_checkpoint(path, hook).path();
}

// Keeps the newest `keep` complete checkpoints and the one `latest` names; removes the rest,
// each at once: renamed to a hidden name (atomic; made durable before anything is deleted),
// then its files removed. Failures are left for the next save (the save itself is complete).
inline void rotate_checkpoints(const std::string& dir, std::size_t keep, const std::string& latest,
                               const io_hook* hook = nullptr) {
  if (keep == 0) return;
  auto all = list_checkpoints(dir);
  if (all.size() <= keep) return;
  std::vector<std::string> trash;
  for (std::size_t i = 0; i + keep < all.size(); ++i) {
    if (all[i].name == latest) continue;
    const std::string t = dir + "/." + all[i].name + ".deleting.tmp";
    try {
      remove_tree(t, hook);  // a leftover of the same name would block the rename
      rename_path(dir + "/" + all[i].name, t, hook);
      trash.push_back(t);
    } catch (const error&) {
    }
  }
  if (trash.empty()) return;
  try {
    sync_directory(dir, hook);  // gone from the listing for good before its files go
    for (const auto& t : trash) remove_tree(t, hook);
  } catch (const error&) {
  }
}

}  // namespace zshard::checkpoint

#pragma once
// A rendezvous through the file system, for the part of a save where ranks write for as long
// as their disk takes. A collective there would make every fast rank wait inside the
// communicator for the slowest writer and trip its timeout (thread_world's 60 s, MPI's or
// NCCL's watchdog) on a slow disk. Instead each rank posts its outcome as a small marker file
// in the checkpoint's temporary directory (written, then renamed into place, so it appears
// whole) and polls for every rank's marker under a deadline of its own (save_options::
// io_timeout, default 30 minutes). All ranks read the same markers, so all reach the same
// decision, and they leave within one poll interval of each other. The directory must be
// shared by the ranks (one machine, or a network file system).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "zshard/checkpoint/file_io.hpp"

namespace zshard::checkpoint {

struct rank_outcome {
  bool ok = false;
  std::string text;  // what the rank reports: its result, or its error (encode_error)
};

inline std::string marker_name(int rank, bool ok) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank-%05d.%s", rank, ok ? "done" : "failed");
  return buf;
}

// Best effort when posting a failure (the disk may be full): a missing marker ends in the
// waiters' timeout, which names the rank.
inline void post_outcome(const std::string& dir, int rank, bool ok, const std::string& text,
                         const io_hook* hook = nullptr) {
  const std::string part = dir + "/." + marker_name(rank, ok) + ".part";
  write_small_file(part, text, hook);
  rename_path(part, dir + "/" + marker_name(rank, ok), hook);
}

// Every rank's outcome, in rank order; throws io after `timeout` naming the ranks still missing.
inline std::vector<rank_outcome> await_outcomes(const std::string& dir, int world, std::chrono::milliseconds timeout,
                                                const std::string& what, const io_hook* hook = nullptr) {
  namespace fs = std::filesystem;
  std::vector<rank_outcome> out(static_cast<std::size_t>(world));
  std::vector<bool> seen(out.size(), false);
  std::size_t count = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  while (true) {
    for (int r = 0; r < world; ++r) {
      const auto i = static_cast<std::size_t>(r);
      if (seen[i]) continue;
      for (bool ok : {true, false}) {
        const std::string m = dir + "/" + marker_name(r, ok);
        std::error_code ec;
        if (!fs::exists(m, ec)) continue;
        out[i] = {ok, read_small_file(m, std::size_t{64} << 20, hook)};
        seen[i] = true;
        ++count;
        break;
      }
    }
    if (count == out.size()) return out;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < world; ++r)
        if (!seen[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw error(error_kind::io,
                  what + ": rank(s) " + missing + " did not finish writing within " +
                      std::to_string(timeout.count()) + " ms (no marker in '" + dir + "')",
                  "a rank died or its disk is very slow: check that rank, or raise save_options::io_timeout");
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(20)) pause *= 2;
  }
}

}  // namespace zshard::checkpoint

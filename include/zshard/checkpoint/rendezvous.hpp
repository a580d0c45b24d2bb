#pragma once
// A rendezvous through the file system, for the part of a save or an export where ranks write
// for as long as their disk takes. A collective there would make every fast rank wait inside
// the communicator for the slowest writer and trip its timeout (thread_world's 60 s, MPI's or
// NCCL's watchdog) on a slow disk. Instead each rank posts its outcome as a marker file and
// polls for every rank's marker under a deadline of its own (save_options::io_timeout, default
// 30 minutes). The directory must be shared by the ranks (one machine, or a network file system).
//
// Posting needs no free space, so that a full disk cannot keep a rank from saying it failed:
// before anyone writes, rank 0 creates an empty marker per rank, `.rank-0000q.pending`
// (prepare_markers, inside a collective: a failure there fails every rank); a rank that is done
// renames its own to `rank-0000q.done` or `rank-0000q.failed`, and if even that rename fails it
// removes it. A done or failed marker, or a pending one gone without either, says that its
// rank has finished. Every rank leaves the wait within one poll interval of the others once
// all have; what each has to say (its report, or its error with the file and the system's
// reason) then travels by a collective that every rank is already at (rank_writes.hpp).
// Only a rank that can neither rename nor remove its marker (a file system that refuses every
// change) leaves the others to their deadline, which names it; that rank fails at once.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zshard/checkpoint/file_io.hpp"

namespace zshard::checkpoint {

enum class marker_state : std::uint8_t { pending, done, failed, removed };

inline std::string marker_name(int rank, marker_state s) {
  char buf[48];
  std::snprintf(buf, sizeof buf, s == marker_state::pending ? ".rank-%05d.pending" : "rank-%05d.%s", rank,
                s == marker_state::done ? "done" : "failed");
  return buf;
}

// Rank 0, before anyone writes: one empty pending marker per rank in `dir` (which exists).
inline void prepare_markers(const std::string& dir, int world, const io_hook* hook = nullptr) {
  for (int q = 0; q < world; ++q) file_handle::create(dir + "/" + marker_name(q, marker_state::pending), hook).close();
}

// Posts this rank's outcome by renaming its pending marker. Returns the rename's error when it
// failed and the marker was removed instead (the others read that as a failure of this rank);
// throws when the marker can be neither renamed nor removed.
inline std::optional<error> post_outcome(const std::string& dir, int rank, bool ok, const io_hook* hook = nullptr) {
  const std::string pending = dir + "/" + marker_name(rank, marker_state::pending);
  try {
    rename_path(pending, dir + "/" + marker_name(rank, ok ? marker_state::done : marker_state::failed), hook);
    return std::nullopt;
  } catch (const error& e) {
    try {
      remove_path(pending, hook);
    } catch (const error& also) {
      throw error(e.kind(),
                  e.message() + "; removing the marker failed too (" + also.message() +
                      "): the other ranks wait io_timeout for this rank, then name it",
                  "check the file system of the checkpoint directory (read-only, failing, unreachable?)");
    }
    return e;
  }
}

// Waits until every rank has finished (its marker done, failed or removed) and returns the
// markers' states in rank order; throws io after `timeout` naming the ranks still pending.
inline std::vector<marker_state> await_outcomes(const std::string& dir, int world, std::chrono::milliseconds timeout,
                                                const std::string& what) {
  namespace fs = std::filesystem;
  // true or false; nothing when the file system could not say (asked again at the next poll)
  auto present = [](const std::string& p) -> std::optional<bool> {
    std::error_code ec;
    const bool e = fs::exists(p, ec);
    if (ec) return std::nullopt;
    return e;
  };
  std::vector<marker_state> out(static_cast<std::size_t>(world), marker_state::pending);
  std::size_t count = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  while (true) {
    for (int r = 0; r < world; ++r) {
      auto& s = out[static_cast<std::size_t>(r)];
      if (s != marker_state::pending) continue;
      // pending first: a rename makes the pending marker disappear and its outcome appear at once
      const auto pending = present(dir + "/" + marker_name(r, marker_state::pending));
      if (!pending || *pending) continue;
      const auto done = present(dir + "/" + marker_name(r, marker_state::done));
      const auto failed = present(dir + "/" + marker_name(r, marker_state::failed));
      if (!done || !failed) continue;
      s = *done ? marker_state::done : *failed ? marker_state::failed : marker_state::removed;
      ++count;
    }
    if (count == out.size()) return out;
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < world; ++r)
        if (out[static_cast<std::size_t>(r)] == marker_state::pending)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
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

#pragma once
// The write phase of a save or an export: every rank writes its own part of the output for as
// long as its disk takes, then the ranks meet through marker files (rendezvous.hpp), not a
// collective, so a slow disk cannot trip the communicator's timeout. Once every marker is
// there, every rank is past its writes and one small collective carries what each has to say:
// its report (what rank 0 needs to commit) or its error. A rank's failure (its write threw, or
// its marker could not be posted) thus fails the phase on every rank at once with the same
// error, the lowest failing rank's, naming it and the real cause; a rank that never posts
// fails the others at save_options::io_timeout, naming it.
#include <chrono>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/rendezvous.hpp"

namespace zshard::checkpoint {

// write() returns this rank's report (one short line); on_failure() runs on a rank whose write
// threw, before it posts its marker (frees the space its partial output holds). `markers` was
// prepared (prepare_markers) for every rank of the job. Returns every rank's report, in rank
// order. Collective over the job.
template <class Engine, class Write, class OnFailure>
std::vector<std::string> write_and_meet(Engine& eng, const std::string& markers, std::chrono::milliseconds timeout,
                                        const std::string& what, Write&& write, OnFailure&& on_failure,
                                        const io_hook* hook = nullptr) {
  const int rank = job_comm(eng).rank(), world = job_comm(eng).size();
  bool ok = true;
  std::string text;
  try {
    text = write();
  } catch (const error& e) {
    ok = false;
    text = encode_error(e);
  } catch (const std::exception& e) {
    ok = false;
    text = encode_error(error(error_kind::io, e.what()));
  }
  if (!ok) on_failure();
  try {
    if (auto e = post_outcome(markers, rank, ok, hook)) {
      if (ok) text = encode_error(*e);
      ok = false;
    }
  } catch (const error& e) {
    throw error(e.kind(), what + " (rank " + std::to_string(rank) + "): " + e.message(), e.hint());
  }
  await_outcomes(markers, world, timeout, what);
  // Every rank is past its writes. Each one's own word decides, '1' + report or '0' + error:
  // the markers only said that it finished (a file system that shows a rename late cannot
  // turn a success into a failure, nor a failure into a success).
  const auto said = exchange_messages(eng, (ok ? "1" : "0") + text);
  std::vector<std::string> reports;
  for (int q = 0; q < world; ++q) {
    const std::string& s = said[static_cast<std::size_t>(q)];
    if (s.empty() || s[0] != '1') throw decode_error(s.empty() ? s : s.substr(1), q, what);
    reports.push_back(s.substr(1));
  }
  return reports;
}

}  // namespace zshard::checkpoint

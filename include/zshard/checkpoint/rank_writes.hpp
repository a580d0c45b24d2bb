#pragma once
// The write phase of a save or an export: every rank writes its own part of the output for as
// long as its disk takes, then the ranks meet through marker files (rendezvous.hpp), not a
// collective, so a slow disk cannot trip the communicator's timeout. A rank's failure (an
// exception from its write, or no marker within the timeout) fails the phase on every rank
// with the same error, the lowest failing rank's, naming it.
#include <chrono>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/rendezvous.hpp"

namespace zshard::checkpoint {

// write() returns this rank's report (one short line: what rank 0 needs to commit); on_failure()
// runs on a rank whose write threw, before it posts its marker (free the space a full disk
// needs for the marker). Returns every rank's report, in rank order.
template <class Write, class OnFailure>
std::vector<std::string> write_and_meet(const std::string& markers, int rank, int world,
                                        std::chrono::milliseconds timeout, const std::string& what, Write&& write,
                                        OnFailure&& on_failure, const io_hook* hook = nullptr) {
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
    post_outcome(markers, rank, ok, text, hook);
  } catch (...) {
    // the others time out naming this rank
  }
  const auto outcomes = await_outcomes(markers, world, timeout, what, hook);
  std::vector<std::string> reports;
  for (int q = 0; q < world; ++q) {
    const auto& o = outcomes[static_cast<std::size_t>(q)];
    if (!o.ok) throw decode_error(o.text, q, what);
    reports.push_back(o.text);
  }
  return reports;
}

}  // namespace zshard::checkpoint

#pragma once
// Runs ranks of which one returns early from its run_ranks function, and measures how long the
// others took to fail: the tests check they fail at once, naming it, not at the collective timeout.
#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <string>

namespace test_support {

struct early_return_failure {
  std::string message;                         // what the ranks threw ("" when nothing was)
  std::chrono::steady_clock::duration waited;  // from the start of the run to the throw
};

// run() starts the ranks; `what` names the case in the test's output beside the time waited.
template <class Run>
early_return_failure run_with_early_return(const std::string& what, Run&& run) {
  early_return_failure r;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run();
  } catch (const std::exception& e) {
    r.message = e.what();
  }
  r.waited = std::chrono::steady_clock::now() - t0;
  MESSAGE(what << ": the others failed after "
               << std::chrono::duration_cast<std::chrono::milliseconds>(r.waited).count() << " ms");
  return r;
}

}  // namespace test_support

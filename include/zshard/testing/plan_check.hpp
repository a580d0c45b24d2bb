#pragma once
// "Measured peak <= planned peak" for a user's test suite: compares a rank's ledger after a
// run with the memory plan computed before it (plan/memory_plan.hpp), per category and in
// total, and says which figures the run exceeded.
//
//   const auto plan = zshard::plan::plan_memory(spec, cfg, world, schedule);
//   ... train ...
//   ZSHARD_CHECK_PEAK_WITHIN_PLAN(backend.ledger(), plan.device);
#include <string>
#include <vector>

#include "zshard/core/memory_ledger.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/testing/invariants.hpp"  // ZSHARD_TESTING_NEEDS_DOCTEST

namespace zshard::testing {

inline std::vector<std::string> peak_over_plan(const memory_ledger& measured, const plan::ledger_plan& planned) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < mem_category_count; ++i) {
    const auto c = static_cast<mem_category>(i);
    if (measured.peak(c) > planned.peak_of(c))
      v.push_back(std::string(to_string(c)) + " peaked at " + format_bytes(double(measured.peak(c))) +
                  ", above the planned " + format_bytes(double(planned.peak_of(c))));
  }
  if (measured.total_peak() > planned.total_peak)
    v.push_back("total peaked at " + format_bytes(double(measured.total_peak())) + ", above the planned " +
                format_bytes(double(planned.total_peak)));
  return v;
}

}  // namespace zshard::testing

// A macro, so doctest may come before or after this header (see testing/invariants.hpp).
#define ZSHARD_CHECK_PEAK_WITHIN_PLAN(ledger, planned)                                      \
  do {                                                                                      \
    ZSHARD_TESTING_NEEDS_DOCTEST;                                                           \
    for (const auto& zshard_violation : ::zshard::testing::peak_over_plan(ledger, planned)) \
      FAIL_CHECK(zshard_violation);                                                         \
  } while (0)

#pragma once
// How sharded training is compared with the float64 single-process reference (I7), shared by
// the host equivalence tests and their GPU twins (tests/gpu/engine_cases.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "toy_training.hpp"

namespace toy {

using zshard::dtype;

// Largest |engine - reference| relative to the reference's magnitude, per parameter.
// f32 working params: the engine's f32 arithmetic against float64 differs by rounding only;
// 1e-5 relative (normwise) leaves a wide margin over the ~1e-7 per operation.
// bf16/f16 working params: the f32 masters agree to ~1e-6, but a working value is the master
// rounded to 8 (bf16) or 11 (f16) significant bits, so where a master sits next to a rounding
// boundary the two may round apart by one unit in the last place: allow exactly one ulp,
// 2^-7 (bf16) or 2^-10 (f16) relative to the value.
inline void check_equal(const train_result& got, const train_result& want, dtype working, const std::string& what) {
  INFO(what);
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t p = 0; p < got.params.size(); ++p) {
    INFO("parameter #" << p);
    REQUIRE(got.params[p].size() == want.params[p].size());
    if (working == dtype::f32) {
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < got.params[p].size(); ++i) {
        diff += std::pow(double(got.params[p][i]) - want.params[p][i], 2);
        norm += std::pow(double(want.params[p][i]), 2);
      }
      CHECK(std::sqrt(diff) <= 1e-5 * std::sqrt(norm));
    } else {
      const double ulp = working == dtype::bf16 ? 0x1p-7 : 0x1p-10;
      for (std::size_t i = 0; i < got.params[p].size(); ++i)
        REQUIRE(std::abs(double(got.params[p][i]) - want.params[p][i]) <= ulp * std::abs(want.params[p][i]) + 1e-30);
    }
  }
  REQUIRE(got.reports.size() == want.reports.size());
  for (std::size_t s = 0; s < got.reports.size(); ++s) {
    CHECK(got.reports[s].skipped == want.reports[s].skipped);
    CHECK(got.reports[s].step == want.reports[s].step);
    if (!want.reports[s].skipped && working == dtype::f32)
      CHECK(got.reports[s].grad_norm == doctest::Approx(want.reports[s].grad_norm).epsilon(1e-5));
  }
}

inline train_options base_options(int world) {
  train_options o;
  o.world = world;
  o.steps = 4;
  o.engine.adamw.lr = 1e-2f;
  o.engine.adamw.weight_decay = 0.1f;
  o.engine.partition.persistence_threshold_numel = 8;  // biases and the frozen scale replicated
  o.engine.reduce.reduce_bucket_numel = 100;           // several flushes per backward
  return o;
}

}  // namespace toy

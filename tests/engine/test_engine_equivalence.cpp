// Sharded training equals single-process training (I7): for world sizes 1, 2, 3, 4 and 8, the
// parameters after N steps match a float64 single-process reference on the same global batch.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "toy_training.hpp"

using zshard::dtype;

namespace {

// Largest |engine - reference| relative to the reference's magnitude, per parameter.
// f32 working params: the engine's f32 arithmetic against float64 differs by rounding only;
// 1e-5 relative (normwise) leaves a wide margin over the ~1e-7 per operation.
// bf16/f16 working params: the f32 masters agree to ~1e-6, but a working value is the master
// rounded to 8 (bf16) or 11 (f16) significant bits, so where a master sits next to a rounding
// boundary the two may round apart by one unit in the last place: allow exactly one ulp,
// 2^-7 (bf16) or 2^-10 (f16) relative to the value.
void check_equal(const toy::train_result& got, const toy::train_result& want, dtype working, const std::string& what) {
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

toy::train_options base(int world) {
  toy::train_options o;
  o.world = world;
  o.steps = 4;
  o.engine.adamw.lr = 1e-2f;
  o.engine.adamw.weight_decay = 0.1f;
  o.engine.partition.persistence_threshold_numel = 8;  // biases and the frozen scale replicated
  o.engine.reduce.reduce_bucket_numel = 100;           // several flushes per backward
  return o;
}

}  // namespace

TEST_CASE("sharded f32 training equals the float64 single-process reference") {
  for (int world : {1, 2, 3, 4, 8}) {
    for (int variant = 0; variant < 3; ++variant) {
      auto o = base(world);
      std::string what = "world " + std::to_string(world);
      if (variant == 1) {
        o.micro_batches = 3;
        what += ", 3 micro-batches";
      }
      if (variant == 2) {
        o.micro_batches = 2;
        o.engine.clip_norm = 0.05;  // well below the gradient norm: clipping active every step
        what += ", 2 micro-batches, clipping";
      }
      const auto got = toy::train_sharded(o);
      const auto want = toy::train_reference(o);
      check_equal(got, want, dtype::f32, what);
      if (variant == 2)
        for (const auto& r : got.reports) CHECK(r.clip_coefficient < 1.0);
    }
  }
}

TEST_CASE("bf16 working parameters: equal to the reference within one bf16 ulp") {
  for (int world : {1, 3, 4}) {
    auto o = base(world);
    o.engine.param_dtype = dtype::bf16;
    o.micro_batches = 2;
    check_equal(toy::train_sharded(o), toy::train_reference(o), dtype::bf16, "bf16, world " + std::to_string(world));
  }
}

TEST_CASE("f16 with dynamic loss scaling: a forced overflow skips the step on every rank and lowers the scale") {
  for (int world : {2, 3, 8}) {
    auto o = base(world);
    o.engine.param_dtype = dtype::f16;
    o.engine.loss_scale = {.enabled = true, .initial_scale = 1024.f, .growth_factor = 2.f, .backoff_factor = 0.5f,
                           .growth_interval = 2, .min_scale = 1.f};
    o.steps = 5;
    o.overflow_step = 1;
    const auto got = toy::train_sharded(o);
    check_equal(got, toy::train_reference(o), dtype::f16, "f16, world " + std::to_string(world));
    REQUIRE(got.reports.size() == 5);
    CHECK(!got.reports[0].skipped);
    CHECK(got.reports[0].loss_scale == 1024.f);
    CHECK(got.reports[1].skipped);
    CHECK(got.reports[1].loss_scale == 512.f);  // backoff after the overflow
    CHECK(got.reports[1].step == 1);            // the skipped step is not counted
    CHECK(got.reports[3].loss_scale == 1024.f); // grown back after growth_interval good steps
  }
}

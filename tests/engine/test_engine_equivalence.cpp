// Sharded training equals single-process training (I7): for world sizes 1, 2, 3, 4 and 8, the
// parameters after N steps match a float64 single-process reference on the same global batch.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "equivalence_check.hpp"

using zshard::dtype;

using toy::check_equal;

TEST_CASE("sharded f32 training equals the float64 single-process reference") {
  for (int world : {1, 2, 3, 4, 8}) {
    for (int variant = 0; variant < 3; ++variant) {
      auto o = toy::base_options(world);
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
    auto o = toy::base_options(world);
    o.engine.param_dtype = dtype::bf16;
    o.micro_batches = 2;
    check_equal(toy::train_sharded(o), toy::train_reference(o), dtype::bf16, "bf16, world " + std::to_string(world));
  }
}

TEST_CASE("f16 with dynamic loss scaling: a forced overflow skips the step on every rank and lowers the scale") {
  for (int world : {2, 3, 8}) {
    auto o = toy::base_options(world);
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

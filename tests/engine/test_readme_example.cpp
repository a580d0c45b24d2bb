// The README's usage example, compiled and run through the umbrella header, so the docs
// cannot drift from the API.
#include <doctest/doctest.h>

#include "zshard/testing/invariants.hpp"
#include "zshard/zshard.hpp"

TEST_CASE("the README example trains and leaves a clean step boundary") {
  zshard::model_spec spec;
  auto w = spec.add_param("block0.w", {64, 64});
  auto b = spec.add_param("block0.b", {64}, {.decay = false, .init = zshard::init::constant(0.0f)});
  auto block0 = spec.add_module("block0", {w, b});

  zshard::run_ranks(4, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, {});
    for (int step = 0; step < 10; ++step) {
      { auto g = eng.forward(block0); CHECK(g.param_data<float>(1)[0] == 0.0f); }
      eng.begin_backward();
      {
        auto g = eng.backward(block0);
        g.grad_data(0)[0] += 1.0f;
      }
      eng.end_backward();
      const auto r = eng.step();
      CHECK(r.grad_norm == doctest::Approx(1.0));
      ZSHARD_CHECK_STEP_INVARIANTS(eng);
      ZSHARD_CHECK_MEMORY_BOUNDS(eng);
    }
    // AdamW moved w[0] against its gradient, by about lr per step
    const auto w0 = eng.gather_param(w);
    const auto init = spec.param(w).init(0);
    CHECK(w0[0] < init - 5e-3f);
  });
}

// zshard's testing macros work whatever the include order: here zshard's headers come first
// and doctest last (test_readme_example.cpp includes them the other way round).
#include "zshard/testing/invariants.hpp"
#include "zshard/testing/plan_check.hpp"
#include "zshard/zshard.hpp"

#include <doctest/doctest.h>

TEST_CASE("ZSHARD_CHECK_* work when doctest is included after zshard") {
  zshard::model_spec spec;
  const auto w = spec.add_param("w", {16, 8});
  const auto m = spec.add_module("m", {w});
  zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, {});
    { auto g = eng.forward(m); }
    eng.begin_backward();
    {
      auto g = eng.backward(m);
      g.grad_data(0)[0] += 1.0f;
    }
    eng.end_backward();
    eng.step();
    ZSHARD_CHECK_STEP_INVARIANTS(eng);
    ZSHARD_CHECK_MEMORY_BOUNDS(eng);
    // a violation is reported through doctest: an empty plan is exceeded by any real run
    CHECK_FALSE(zshard::testing::peak_over_plan(eng.ledger(), zshard::plan::ledger_plan{}).empty());
  });
}

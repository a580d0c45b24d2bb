// The HookTracker's cases one by one (I1-I4): nested modules, loops, shared parameters, unused
// modules, no-grad passes, recompute, a loss module without parameters; and misuse.
#include "graph_harness.hpp"

using namespace graph_test;

namespace {

graph base_graph() {
  graph g;
  g.param_sizes = {10, 7, 33, 5, 16};
  g.trainable = {true, true, true, false, true};
  g.cfg.reduce.reduce_bucket_numel = 20;
  return g;
}

}  // namespace

TEST_CASE("a module used several times: a loop, counted per call") {
  graph g = base_graph();
  g.modules = {{0, 1}, {2}};
  g.program = {{.module = 0}, {.module = 1}, {.module = 1}, {.module = 1}};  // m1 three times
  for (int world : {1, 3, 4}) run_and_check(g, world);
}

TEST_CASE("a parameter shared by two modules is complete only after every use's backward") {
  graph g = base_graph();
  g.modules = {{0, 2}, {1}, {2, 4}};  // p2 tied between m0 and m2
  g.program = {{.module = 0}, {.module = 1}, {.module = 2}};
  g.micro_batches = 2;
  for (int world : {2, 3}) run_and_check(g, world);
}

TEST_CASE("checkpointed blocks: recompute gathers but never counts") {
  graph g = base_graph();
  g.modules = {{0}, {1, 2}, {4}};
  g.program = {{.module = 0}, {.module = 1, .checkpointed = true}, {.module = 2, .checkpointed = true}};
  for (int world : {1, 2, 5}) run_and_check(g, world);
}

TEST_CASE("no-grad passes (evaluation, a reference model) before and between counted uses") {
  graph g = base_graph();
  g.modules = {{0}, {1, 2}, {3, 4}};
  g.program = {{.module = 0, .counted = false}, {.module = 1, .counted = false}, {.module = 0}, {.module = 1},
               {.module = 2, .counted = false}, {.module = 2}};
  for (int world : {1, 3}) run_and_check(g, world);
}

TEST_CASE("a module whose backward never runs is swept at end_backward (I3)") {
  graph g = base_graph();
  g.modules = {{0}, {1, 2}, {4}};
  g.program = {{.module = 0}, {.module = 1, .skip_backward = true}, {.module = 2}};
  for (int world : {1, 2, 3}) run_and_check(g, world);
}

TEST_CASE("nested modules: an inner module's scopes run inside the outer's") {
  graph g = base_graph();
  g.modules = {{0, 1}, {2}, {4}};
  g.program = {{.module = 0, .nested = 1}, {.module = 1, .nested = 2}, {.module = 2}};
  g.cfg.prefetch.max_live_numel = 1000;
  for (int world : {1, 2, 4}) run_and_check(g, world);
}

TEST_CASE("a loss module with no parameters") {
  graph g = base_graph();
  g.modules = {{0, 1}, {}};
  g.program = {{.module = 0}, {.module = 1}};
  for (int world : {1, 2}) run_and_check(g, world);
}

TEST_CASE("misuse is a clear usage error") {
  graph g = base_graph();
  g.modules = {{0}, {1}};
  const model_spec spec = make_spec(g);
  run_ranks(2, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, spec, {});
    { auto s = eng.forward(0); }
    eng.begin_backward();
    { auto s = eng.backward(0); }
    // a second backward for a single counted use
    CHECK_THROWS_WITH_AS(eng.backward(0), doctest::Contains("no counted forward pending"), error);
    CHECK_THROWS_AS(eng.begin_backward(), error);  // twice
    eng.end_backward();
    CHECK_THROWS_WITH_AS(eng.end_backward(), doctest::Contains("without begin_backward"), error);
    { auto s = eng.forward(1); }
    // step() with a counted forward whose backward never ran
    CHECK_THROWS_WITH_AS(eng.step(), doctest::Contains("whose backward has not run"), error);
    eng.begin_backward();
    eng.end_backward();
    CHECK(eng.step().swept.size() == 1);
  });
}

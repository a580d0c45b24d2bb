// Bad input and misuse: each a clear zshard::error of the right kind, no crash, no hang.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "toy_training.hpp"

using namespace zshard;

namespace {

using host_engine = engine<host_backend, thread_comm>;

using test_support::kind_of;
using test_support::message_of;

}  // namespace

TEST_CASE("model registration errors") {
  model_spec spec;
  auto p = spec.add_param("w", {4, 4});
  CHECK(kind_of([&] { spec.add_param("w", {2}); }) == error_kind::config);
  CHECK(message_of([&] { spec.add_param("w", {2}); }).find("registered twice") != std::string::npos);
  CHECK(kind_of([&] { spec.add_param("z", {3, 0}); }) == error_kind::config);
  CHECK(kind_of([&] { spec.add_module("m", {p, p}); }) == error_kind::config);
  CHECK(kind_of([&] { spec.add_module("m", {7}); }) == error_kind::config);
  spec.add_param("unused", {3});
  spec.add_module("m", {p});
  CHECK(message_of([&] { spec.validate(); }).find("'unused' is used by no module") != std::string::npos);
}

TEST_CASE("a module of many parameters: duplicates found wherever they are, named in the error") {
  model_spec spec;
  std::vector<param_id> ps;
  for (int i = 0; i < 20000; ++i) ps.push_back(spec.add_param("p" + std::to_string(i), {1}));
  auto dup = ps;
  dup.push_back(ps[12345]);
  CHECK(message_of([&] { spec.add_module("flat", dup); }).find("lists parameter 'p12345' twice") != std::string::npos);
  CHECK(spec.modules().empty());  // a refused module is not registered
  std::reverse(ps.begin(), ps.end());
  CHECK(spec.add_module("flat", ps) == 0);
  CHECK(spec.module(0).params.size() == 20000);
}

TEST_CASE("scopes out of order are usage errors") {
  run_ranks(2, [](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    std::vector<std::string> log;  // this rank's engine only
    engine_config cfg;
    cfg.log = [&](const std::string& line) { log.push_back(line); };
    host_engine eng(backend, comm, toy::make_spec({}, id), cfg);
    // backward of a module never forwarded
    eng.begin_backward();
    CHECK(message_of([&] { auto g = eng.backward(id.head); }).find("no counted forward pending") != std::string::npos);
    eng.end_backward();
    // recompute outside backward
    CHECK(kind_of([&] { auto g = eng.recompute(id.embed); }) == error_kind::usage);
    // step inside backward
    { auto g = eng.forward(id.embed); }
    eng.begin_backward();
    CHECK(message_of([&] { eng.step(); }).find("step() inside backward") != std::string::npos);
    // a counted forward during backward
    CHECK(kind_of([&] { auto g = eng.forward(id.head); }) == error_kind::usage);
    {
      auto g = eng.backward(id.embed);
      // grad of a frozen parameter, end_backward with a scope open
      CHECK(kind_of([&] { eng.end_backward(); }) == error_kind::usage);
    }
    {
      auto g = eng.forward(id.layer[0], use_kind::no_grad);  // allowed anywhere
      CHECK(kind_of([&] { (void)g.grad(0); }) == error_kind::usage);
    }
    eng.end_backward();
    eng.step();
    // step twice without a backward
    CHECK(kind_of([&] { eng.step(); }) == error_kind::usage);
    // a frozen parameter has no gradient
    { auto g = eng.forward(id.layer[0]); }
    eng.begin_backward();
    {
      auto g = eng.backward(id.layer[0]);
      CHECK(kind_of([&] { (void)g.grad(2); }) == error_kind::usage);
      CHECK(kind_of([&] { (void)g.param(3); }) == error_kind::usage);
    }
    eng.end_backward();
    eng.step();
    // The second step left the first one's trace (it starts at layer0, not embed): said once.
    REQUIRE(log.size() == 1);
    CHECK(log[0].find("module 'layer0' (counted) at scope #0 where the trace has 'embed' (counted)") !=
          std::string::npos);
  });
}

TEST_CASE("a model that differs across ranks is a configuration error on every rank, not a hang") {
  for (int world : {2, 3}) {
    std::string msg = message_of([&] {
      run_ranks(world, [world](thread_comm& comm) {
        toy::ids id;
        toy::config mc;
        mc.name = world == 3 ? "student" : "";
        if (comm.rank() == 1) mc.dim = 9;  // rank 1 disagrees
        host_backend backend;
        host_engine eng(backend, comm, toy::make_spec(mc, id), {});
      });
    });
    CHECK(msg.find("ranks disagree on the model (model_spec " + std::string(world == 3 ? "'student' (#" : "#")) !=
          std::string::npos);
  }
}

TEST_CASE("configuration errors at construction") {
  run_ranks(1, [](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine_config cfg;
    cfg.prefetch.max_live_numel = 50;  // the embedding alone is 13 x 8 = 104 elements
    CHECK(message_of([&] { host_engine e(backend, comm, toy::make_spec({}, id), cfg); }).find("max_live_numel") !=
          std::string::npos);
    cfg.prefetch.allow_oversized_module = true;
    host_engine ok(backend, comm, toy::make_spec({}, id), cfg);
    cfg.adamw.lr = -1;
    CHECK(kind_of([&] { host_engine e(backend, comm, toy::make_spec({}, id), cfg); }) == error_kind::config);
  });
}

TEST_CASE("uses whose backward never ran are swept at end_backward, reduced, released and reported (I3)") {
  toy::on_toy_engines(2, [](auto& eng, const toy::ids& id, thread_comm&) {
    { auto g = eng.forward(id.embed); }
    { auto g = eng.forward(id.head); }
    { auto g = eng.forward(id.head); }  // the head used twice, only one backward runs
    eng.begin_backward();
    {
      auto g = eng.backward(id.head);
      g.grad_data(1)[0] = 1.0f;
    }
    CHECK(eng.tracker().pending_uses(id.head) == 1);
    CHECK(eng.tracker().pending_uses(id.embed) == 1);
    eng.end_backward();
    CHECK(eng.tracker().pending_uses(id.head) == 0);
    CHECK(eng.backend().ledger().current(mem_category::gathered_params) == 0);
    CHECK(eng.backend().ledger().current(mem_category::grad_buckets) == 0);
    const auto r = eng.step();
    REQUIRE(r.swept.size() == 2);
    CHECK(r.swept[0].module == id.embed);
    CHECK(r.swept[0].pending_uses == 1);
    CHECK(r.swept[1].module == id.head);
    CHECK(r.grad_norm > 0);  // the partial gradient of c was reduced, not dropped
  });
}

namespace {

// A Reducer that fails on its first gradient, as a broken collective would.
template <class Backend, class Comm>
struct failing_reducer {
  failing_reducer(param_store<Backend>&, Comm&, const reduce_config&) {}
  template <class Sink>
  void grad_ready(param_id, Sink&) {
    throw error(error_kind::comm, "reduce_scatter failed (injected)");
  }
  template <class Sink>
  void flush(Sink&) {}
  std::size_t pending_numel() const { return 0; }
};
struct failing_reducer_family : test_support::family<reducer_tag, failing_reducer> {};
using failing_policies = test_support::with_reducer<failing_reducer_family>;

}  // namespace

TEST_CASE("a failure when a scope closes in its destructor is not lost: the next engine call rethrows it") {
  for (bool close_explicitly : {false, true}) {
    toy::on_toy_engines<failing_policies>(1, [&](auto& eng, const toy::ids& id, thread_comm&) {
      { auto g = eng.forward(id.embed); }
      eng.begin_backward();
      if (close_explicitly) {  // close() reports the failure directly
        auto g = eng.backward(id.embed);
        CHECK_THROWS_WITH_AS(g.close(), doctest::Contains("injected"), error);
        CHECK_THROWS_WITH_AS(eng.end_backward(), doctest::Contains("injected"), error);  // broken from here on
        return;
      }
      { auto g = eng.backward(id.embed); }  // the destructor cannot throw: the engine keeps the error
      CHECK_THROWS_WITH_AS(eng.end_backward(), doctest::Contains("reduce_scatter failed (injected)"), error);
      CHECK_THROWS_WITH_AS(eng.step(), doctest::Contains("injected"), error);  // and stays broken
    });
  }
}

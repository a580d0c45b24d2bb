// When a collective fails, the buffers it used are freed on the stream that used them, not on
// compute by their destructors (which nothing orders after the failed collective on a GPU).
// Checked on the CPU: the engine runs on the stream checker with a communicator scripted to
// fail one all-gather (before it is enqueued) or one reduce-scatter / all-reduce (after it ran
// on the reduce stream); no access may be unordered, nothing may leak, and the engine says
// what failed.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "../support/checked_rank.hpp"
#include "zshard/engine/engine.hpp"

using namespace zshard;
using test_support::checked_rank;
using test_support::collective;
using testing::checked_backend;

namespace {

using checked_engine = engine<checked_backend, test_support::scripted_thread_comm>;

model_spec make_spec() {
  model_spec spec;
  for (int m = 0; m < 4; ++m) {
    const std::string n = "m" + std::to_string(m);
    spec.add_module(n, {spec.add_param(n + ".w", {7, 9}), spec.add_param(n + ".v", {5, 11}),
                        spec.add_param(n + ".b", {6}, {.decay = false})});
  }
  return spec;
}

engine_config eager_reduce_config() {
  engine_config cfg;
  cfg.partition.persistence_threshold_numel = 8;  // biases replicated: their reductions are all-reduces
  cfg.reduce.reduce_bucket_numel = 1;             // one reduction per gradient, as soon as it completes
  cfg.prefetch.prefetch_numel = 200;              // gathers ahead, so a failing group holds several
  cfg.overlap = true;
  cfg.log = [](const std::string& line) { FAIL_CHECK("unexpected engine log line: " << line); };
  return cfg;
}

template <class Note>
void run_scope(checked_engine::scope g, Note&& note) {
  test_support::use_scope(g, note, [](std::size_t, float) { return 1.0f; });
}

struct failure {
  collective kind;
  std::size_t call;  // counted from the end of construction
};

// Runs one step on 2 ranks with `f` scripted on both: the failure surfaces on both, what its
// collective used is freed where it was used (no unordered access), and nothing leaks.
void check_failure_frees(const failure& f) {
  const model_spec spec = make_spec();
  std::vector<std::string> violations;
  std::vector<int> failed(2, 0);
  std::mutex mu;
  run_ranks(2, [&](thread_comm& inner) {
    checked_rank r(inner);
    auto& comm = r.comm;
    {
      checked_engine eng(r.backend, comm, spec, eager_reduce_config());
      comm.fail_call(f.kind, f.call);
      const auto note = r.note();
      try {
        const module_id last = spec.modules().size() - 1;
        for (module_id m = 0; m <= last; ++m) run_scope(eng.forward(m), note);
        eng.begin_backward();
        for (module_id m = last + 1; m-- > 0;) run_scope(eng.backward(m), note);
        eng.end_backward();  // a failure in a backward scope's close is rethrown here at the latest
        eng.step();
      } catch (const error& e) {
        CHECK(e.kind() == error_kind::comm);
        CHECK(std::string(e.what()).find("scripted failure") != std::string::npos);
        failed[static_cast<std::size_t>(inner.rank())] = 1;
        // The buffer the failed call used was freed there and then (on its stream): no parameter
        // holds it any more, as a gathered value or as a full gradient.
        REQUIRE(comm.failed_buffer() != nullptr);
        for (param_id p = 0; p < spec.params().size(); ++p) {
          CHECK(eng.store()[p].gathered().data() != comm.failed_buffer());
          CHECK(eng.store()[p].full_grad.data() != comm.failed_buffer());
        }
      }
    }
    CHECK(r.backend.ledger().total_current() == 0);  // nothing leaked on the failure path
    r.report(violations, mu);
  });
  CHECK(failed == std::vector<int>{1, 1});
  for (const auto& line : violations) MESSAGE(line);
  CHECK(violations.empty());
}

}  // namespace

TEST_CASE("error paths: a reduce-scatter that fails after it ran frees its buffers on the reduce stream") {
  for (std::size_t call : {1, 2, 5}) {
    INFO("reduce-scatter #", call);
    check_failure_frees({collective::reduce_scatter, call});
  }
}

TEST_CASE("error paths: an all-reduce of a replicated gradient that fails frees it on the reduce stream") {
  check_failure_frees({collective::all_reduce, 2});
}

TEST_CASE("error paths: an all-gather that fails after begin_gather frees its buffer on the gather stream") {
  for (std::size_t call : {1, 2, 3, 6}) {  // first of a group, inside one, a gather ahead, in backward
    INFO("all-gather #", call);
    check_failure_frees({collective::all_gather, call});
  }
}

TEST_CASE("error paths: the control — freeing on compute what the reduce stream used is a violation") {
  // What the destructor of the reduce-scatter's output buffer did before: the checker flags it.
  checked_backend backend;
  checked_backend::stream on_reduce = backend.role_stream(stream_role::reduce);
  {
    buffer<checked_backend> shard(backend, dtype::f32, 16, mem_category::scratch, on_reduce);
    backend.fill_zero(shard.data(), shard.bytes(), on_reduce);  // the collective's write
  }                                                             // freed on compute, unordered
  CHECK(backend.violations().size() == 1);
}

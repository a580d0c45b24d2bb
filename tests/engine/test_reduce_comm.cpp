// Gradient reductions on a communicator of their own (engine's reduce_comm), so that on NCCL
// they do not serialise with the gathers. Checked on the CPU with two thread communicators over
// the same ranks, both wrapped by the stream checker: every reduction goes to the second one,
// every gather to the first, every access stays ordered by the role streams, and training
// equals the one-communicator program bit for bit.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "../support/checked_rank.hpp"
#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/engine/engine.hpp"

using namespace zshard;
using test_support::checked_rank;
using test_support::collective;
using test_support::host_offload_policies;
using testing::checked_backend;

namespace {

using counted = test_support::scripted_thread_comm;

// Shared weights (module 0 and the last use one table), replicated biases, a checkpointed re-run.
model_spec make_spec(std::int64_t dim) {
  model_spec spec;
  const param_id table = spec.add_param("table", {13, dim});
  spec.add_module("embed", {table});
  for (int b = 0; b < 3; ++b) {
    const std::string n = "block" + std::to_string(b);
    spec.add_module(n, {spec.add_param(n + ".w", {dim, dim}), spec.add_param(n + ".b", {dim}, {.decay = false})});
  }
  spec.add_module("head", {table, spec.add_param("head.b", {13}, {.decay = false})});
  return spec;
}

engine_config config(std::size_t bucket, bool tight) {
  engine_config cfg;
  cfg.partition.persistence_threshold_numel = 16;  // biases replicated: all-reduces on the reduce communicator
  cfg.reduce.reduce_bucket_numel = bucket;
  cfg.prefetch.prefetch_numel = 1'000;
  if (tight) cfg.prefetch.max_live_numel = 13 * 12 + 64;  // gathers ahead are evicted unused
  cfg.adamw.lr = 1e-2f;
  cfg.overlap = true;
  cfg.log = [](const std::string& line) { FAIL_CHECK("unexpected engine log line: " << line); };
  return cfg;
}

template <class Engine, class Note>
void train(Engine& eng, int steps, Note&& note) {
  const float rank = float(eng.comm().rank() + 1);
  const auto run = [&](typename Engine::scope g) {
    test_support::use_scope(g, note, [&](std::size_t i, float w) { return 0.25f * w + 0.01f * rank * float(i % 5); });
  };
  const module_id last = eng.spec().modules().size() - 1;
  for (int s = 0; s < steps; ++s) {
    for (int micro = 0; micro < 2; ++micro) {
      for (module_id m = 0; m <= last; ++m) run(eng.forward(m));
      eng.begin_backward();
      for (module_id m = last + 1; m-- > 0;) {
        if (m == 2) run(eng.recompute(m));
        run(eng.backward(m));
      }
      eng.end_backward();
    }
    eng.step();
  }
}

template <class Policies>
std::vector<std::vector<float>> one_comm_reference(const model_spec& spec, const engine_config& cfg, int world) {
  std::vector<std::vector<float>> out;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, spec, cfg);
    train(eng, 2, test_support::no_note);
    std::vector<std::vector<float>> params;
    for (param_id p = 0; p < spec.params().size(); ++p) params.push_back(eng.gather_param(p));
    if (comm.rank() == 0) out = std::move(params);
  });
  return out;
}

template <class Policies>
void check_two_comms(int world, std::size_t bucket, bool tight) {
  INFO("world ", world, ", bucket ", bucket, tight ? ", tight budget" : "");
  const model_spec spec = make_spec(9);
  const engine_config cfg = config(bucket, tight);
  thread_world reduce_world(world);  // the second communicator over the same ranks
  std::mutex mu;
  std::vector<std::vector<float>> got;
  std::vector<std::string> violations;
  run_ranks(world, [&](thread_comm& inner) {
    checked_rank r(inner);  // the gathers' communicator
    auto& comm = r.comm;
    thread_comm reduce_inner(reduce_world, inner.rank());
    test_support::checked_thread_comm reduce_checked(reduce_inner, r.backend);
    counted reduce_comm(reduce_checked);
    std::vector<std::vector<float>> params;
    {
      engine<checked_backend, counted, Policies> eng(r.backend, comm, reduce_comm, spec, cfg);
      CHECK(eng.separate_reduce_comm());
      CHECK(&eng.reduce_comm() == &reduce_comm);
      const std::size_t construction_gathers = comm.calls(collective::all_gather);
      train(eng, 2, r.note());
      // Reductions on the reduce communicator only; gathers and the step's statistics on the other.
      CHECK(reduce_comm.calls(collective::reduce_scatter) > 0);
      CHECK(reduce_comm.calls(collective::all_reduce) > 0);  // replicated biases
      CHECK(reduce_comm.calls(collective::all_gather) == 0);
      CHECK(comm.calls(collective::reduce_scatter) == 0);
      // The step's statistics travel with the ranks' schedule check, one all_gather per step.
      CHECK(comm.calls(collective::all_reduce) == 0);
      CHECK(comm.calls(collective::all_gather) > construction_gathers + 2);
      for (param_id p = 0; p < spec.params().size(); ++p) params.push_back(eng.gather_param(p));
    }
    r.report(violations, mu);
    if (inner.rank() == 0) got = std::move(params);
  });
  for (const auto& v : violations) MESSAGE(v);
  CHECK(violations.empty());
  CHECK(got == one_comm_reference<Policies>(spec, cfg, world));  // same arithmetic, same order
}

}  // namespace

TEST_CASE("reduce communicator: reductions beside the gathers, ordered by the role streams, same training") {
  for (int world : {1, 2, 3})
    for (std::size_t bucket : {std::size_t{1}, std::size_t{1'000'000}})
      for (bool tight : {false, true}) check_two_comms<default_policies>(world, bucket, tight);
  check_two_comms<host_offload_policies>(2, 64, true);
}

TEST_CASE("reduce communicator: the same one by default; one over other ranks is a configuration error") {
  const model_spec spec = make_spec(5);
  thread_world bigger(3);
  run_ranks(2, [&](thread_comm& comm) {
    host_backend backend;
    {
      engine<host_backend, thread_comm> eng(backend, comm, spec, config(64, false));
      CHECK_FALSE(eng.separate_reduce_comm());
      CHECK(&eng.reduce_comm() == &comm);
    }
    thread_comm other(bigger, comm.rank());
    const std::string msg = test_support::message_of(
        [&] { engine<host_backend, thread_comm> eng(backend, comm, other, spec, config(64, false)); });
    CHECK(msg.find("the reduce communicator is rank " + std::to_string(comm.rank()) + " of 3") != std::string::npos);
    CHECK(msg.find("ncclCommSplit") != std::string::npos);
    CHECK(test_support::kind_of([&] {
            engine<host_backend, thread_comm> eng(backend, comm, other, spec, config(64, false));
          }) == error_kind::config);
  });
}

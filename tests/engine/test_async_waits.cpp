// The engine's host waits on an asynchronous backend, checked without a GPU on
// testing::checked_backend (role streams, stream-ordered memory, counted host waits, and an
// injected wait that never finishes: hold_streams):
//   - a wait stuck behind a hung collective ends with the communicator's error (a fake NCCL
//     asynchronous error through poll_health), not after the backend's timeout or never;
//   - an engine destroyed while an exception unwinds aborts its communicators;
//   - the on-device Offloader reads every gradient's sum of squares in one host round trip;
//   - the host Offloader never makes the rank thread wait for the reduce stream in backward.
#include <doctest/doctest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/checked_rank.hpp"
#include "../support/policies.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/engine/engine.hpp"

using namespace zshard;
using namespace std::chrono_literals;
using test_support::checked_rank;
using test_support::host_offload_policies;
using test_support::use_scope;
using testing::checked_backend;

namespace {

using checked = test_support::checked_thread_comm;
using scripted = test_support::scripted_thread_comm;

// A chain of `modules` modules, each a weight and a bias (odd sizes: shards do not divide evenly).
model_spec chain_spec(int modules, std::int64_t dim) {
  model_spec spec;
  for (int m = 0; m < modules; ++m) {
    const std::string n = "m" + std::to_string(m);
    spec.add_module(n, {spec.add_param(n + ".w", {dim, dim}), spec.add_param(n + ".b", {dim + 3})});
  }
  return spec;
}

engine_config config() {
  engine_config cfg;
  cfg.adamw.lr = 1e-2f;
  cfg.overlap = true;
  cfg.offload.host_threads = 2;
  cfg.log = [](const std::string& line) { FAIL_CHECK("unexpected engine log line: " << line); };
  return cfg;
}

// What the training stack does in a scope: gradients that depend on the parameters and the rank.
template <class Engine, class Note>
void run_scope(Engine& eng, typename Engine::scope g, Note&& note) {
  const float rank = float(eng.comm().rank() + 1);
  use_scope(g, note, [&](std::size_t i, float w) { return 0.5f * w + 0.01f * rank * float(i % 7); });
}

template <class Engine, class Note>
void forward_all(Engine& eng, Note&& note) {
  for (module_id m = 0; m < eng.spec().modules().size(); ++m) run_scope(eng, eng.forward(m), note);
}
template <class Engine, class Note>
void backward_all(Engine& eng, Note&& note) {
  eng.begin_backward();
  for (std::size_t m = eng.spec().modules().size(); m-- > 0;) run_scope(eng, eng.backward(m), note);
  eng.end_backward();
}

// What a rank ends training with: every parameter's value and each step's gradient norm.
struct trained {
  std::vector<std::vector<float>> params;
  std::vector<double> norms;
  bool operator==(const trained&) const = default;
};

template <class Engine>
std::vector<std::vector<float>> all_params(Engine& eng) {
  std::vector<std::vector<float>> out;
  for (param_id p = 0; p < eng.spec().params().size(); ++p) out.push_back(eng.gather_param(p));
  return out;
}

// The same training on host_backend, one stream: the reference (rank 0's).
template <class Policies>
trained reference(const model_spec& spec, int steps) {
  std::vector<trained> out(2);
  run_ranks(2, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, spec, config());
    trained& t = out[std::size_t(comm.rank())];
    for (int s = 0; s < steps; ++s) {
      forward_all(eng, test_support::no_note);
      backward_all(eng, test_support::no_note);
      t.norms.push_back(eng.step().grad_norm);
    }
    t.params = all_params(eng);
  });
  return out[0];
}

}  // namespace

TEST_CASE("async waits: a host wait stuck behind a hung collective ends with the communicator's error") {
  const model_spec spec = chain_spec(3, 9);
  std::vector<std::size_t> polls(2, 0);
  run_ranks(2, [&](thread_comm& inner) {
    checked_rank r(inner);
    auto& backend = r.backend;
    auto& comm = r.comm;
    backend.set_wait_timeout(20s);  // far longer than the test may take: the error must come from the check
    {
      engine<checked_backend, scripted> eng(backend, comm, spec, config());
      CHECK(backend.watch().size() == 1);  // the engine registered its communicator's health check
      forward_all(eng, r.note());
      backward_all(eng, r.note());
      backend.hold_streams(true);           // the streams never finish: a collective ahead of them hangs
      comm.fail_health("ncclRemoteError");  // ... and NCCL reports why
      const auto start = std::chrono::steady_clock::now();
      try {
        eng.step();  // its first host wait reads the gradient statistics
        FAIL("step() returned with the streams held");
      } catch (const error& e) {
        CHECK(e.kind() == error_kind::comm);
        CHECK(std::string(e.what()).find("fake NCCL asynchronous error: ncclRemoteError") != std::string::npos);
      }
      CHECK(std::chrono::steady_clock::now() - start < 10s);
      polls[static_cast<std::size_t>(inner.rank())] = comm.health_polls();
    }  // destroyed with the streams still held: its final wait stops on the same check, no hang
    CHECK(backend.watch().size() == 0);
    // The failed step broke the engine (its collective failed), so it aborted its communicator.
    CHECK_FALSE(comm.abort_reason().empty());
    backend.hold_streams(false);
    r.check_ordered();
  });
  CHECK(polls[0] > 0);
  CHECK(polls[1] > 0);
}

TEST_CASE("async waits: an engine destroyed while an exception unwinds aborts its communicators") {
  const model_spec spec = chain_spec(2, 5);
  run_ranks(2, [&](thread_comm& inner) {
    checked_rank r(inner);
    try {
      engine<checked_backend, scripted> eng(r.backend, r.comm, spec, config());
      run_scope(eng, eng.forward(0), test_support::no_note);
      throw std::runtime_error("the training stack failed mid-step");
    } catch (const std::runtime_error&) {
    }
    CHECK(r.comm.abort_reason().find("exception was in flight") != std::string::npos);
    CHECK(r.backend.watch().size() == 0);
  });
}

TEST_CASE("async waits: the on-device Offloader reads the gradient statistics in one host round trip") {
  const model_spec spec = chain_spec(20, 7);  // 40 parameters
  const int steps = 2;
  std::vector<trained> got(2);
  std::vector<std::vector<std::size_t>> step_waits(2);
  run_ranks(2, [&](thread_comm& inner) {
    checked_rank r(inner);
    auto& backend = r.backend;
    trained& t = got[std::size_t(inner.rank())];
    {
      engine<checked_backend, checked> eng(backend, r.checked, spec, config());
      for (int s = 0; s < steps; ++s) {
        forward_all(eng, r.note());
        backward_all(eng, r.note());
        const std::size_t before = backend.host_waits();
        t.norms.push_back(eng.step().grad_norm);
        step_waits[std::size_t(inner.rank())].push_back(backend.host_waits() - before);
      }
      t.params = all_params(eng);
    }
    r.check_ordered();
  });
  // One wait for the local sums (all 40 of them at once), one for the all-reduced global figure.
  for (std::size_t w : step_waits[0]) CHECK(w == 2);
  CHECK(got[0] == reference<default_policies>(spec, steps));  // the same float64 sums in the same order: bitwise
}

TEST_CASE("async waits: the host Offloader never makes the rank thread wait for the reduce stream in backward") {
  const model_spec spec = chain_spec(6, 11);
  const int steps = 2;
  std::vector<trained> got(2);
  run_ranks(2, [&](thread_comm& inner) {
    checked_rank r(inner);
    auto& backend = r.backend;
    backend.set_wait_timeout(300ms);  // a wait in backward (the old behaviour) would fail the test quickly
    trained& t = got[std::size_t(inner.rank())];
    {
      engine<checked_backend, checked, host_offload_policies> eng(backend, r.checked, spec, config());
      for (int s = 0; s < steps; ++s) {
        forward_all(eng, r.note());
        backend.hold_streams(true);  // no copy to the host lands during backward
        const std::size_t before = backend.host_waits();
        backward_all(eng, r.note());
        CHECK(backend.host_waits() == before);       // never waited
        CHECK(eng.offloader().queued_chunks() > 0);  // the copies wait for the helpers, not the rank
        backend.hold_streams(false);
        t.norms.push_back(eng.step().grad_norm);
        CHECK(eng.offloader().queued_chunks() == 0);
      }
      t.params = all_params(eng);
    }
    r.check_ordered();
  });
  CHECK(got[0] == reference<host_offload_policies>(spec, steps));
}

TEST_CASE("async waits: a host Offloader destroyed with copies still queued gives up at once") {
  const model_spec spec = chain_spec(3, 6);
  run_ranks(2, [&](thread_comm& inner) {
    checked_rank r(inner);
    auto& backend = r.backend;
    backend.set_wait_timeout(50ms);
    const auto start = std::chrono::steady_clock::now();
    {
      engine<checked_backend, checked, host_offload_policies> eng(backend, r.checked, spec, config());
      forward_all(eng, test_support::no_note);
      backend.hold_streams(true);
      backward_all(eng, test_support::no_note);
      CHECK(eng.offloader().queued_chunks() > 0);
    }  // the engine's final waits time out (50 ms each); the helpers stop polling at once
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    backend.hold_streams(false);
  });
}

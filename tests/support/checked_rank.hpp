#pragma once
// One rank of a failure-path or stream-order test, set up once for every such test: the stream
// checker's backend (testing/stream_checker.hpp), the rank's thread communicator checked against
// it, and scripted_comm on top (counts, scripted failures, fake health errors). use_scope() is
// what a training stack does inside a scope, with every access noted on the compute stream.
#include <doctest/doctest.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "scripted_comm.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/testing/stream_checker.hpp"

namespace test_support {

using checked_thread_comm = zshard::testing::checked_comm<zshard::thread_comm>;
using scripted_thread_comm = scripted_comm<checked_thread_comm>;

struct checked_rank {
  explicit checked_rank(zshard::thread_comm& inner) : checked(inner, backend), comm(checked) {}

  zshard::testing::checked_backend backend;
  checked_thread_comm checked;  // the communicator, checked (an engine on it runs unscripted)
  scripted_thread_comm comm;    // the same, scripted

  // A training stack's access to `bytes` at `data`, on the compute stream.
  auto note() {
    return [this](const void* data, std::size_t bytes, bool write) {
      backend.note_access(data, bytes, write, zshard::stream_role::compute);
    };
  }
  // Every access was ordered (each violation is printed).
  void check_ordered() const {
    for (const auto& v : backend.violations()) MESSAGE(v);
    CHECK(backend.violations().empty());
  }
  // Appends this rank's violations to `all`, each prefixed with the rank.
  void report(std::vector<std::string>& all, std::mutex& mu) const {
    const std::lock_guard lock(mu);
    for (const auto& v : backend.violations()) all.push_back("rank " + std::to_string(comm.rank()) + ": " + v);
  }
};

// A note that records nothing (a run on host_backend, the reference).
inline constexpr auto no_note = [](const void*, std::size_t, bool) {};

// Inside scope `g`: reads every parameter; in backward, adds grad(i, w[i]) to element i of each
// gradient (w: the parameter's values). Every access goes through `note`.
template <class Scope, class Note, class Grad>
void use_scope(Scope&& g, Note&& note, Grad&& grad) {
  for (std::size_t k = 0; k < g.param_count(); ++k) {
    const auto view = g.param(k);
    note(view.data(), view.bytes(), false);
    if (!g.is_backward()) continue;
    const auto gradient = g.grad(k);
    note(gradient.data(), gradient.bytes(), true);
    const auto w = view.template as<const float>();
    const auto d = gradient.template as<float>();
    for (std::size_t i = 0; i < d.size(); ++i) d[i] += grad(i, w[i]);
  }
}

}  // namespace test_support

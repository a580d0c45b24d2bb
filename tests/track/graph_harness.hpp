#pragma once
// Module graphs for HookTracker/Prefetcher tests: parameters with known values, modules that
// share them, and a per-micro-batch program of scopes (counted, no-grad, nested, checkpointed,
// loops, uses whose backward never runs). Every backward writes 1 into each gradient element,
// so the reduced gradient of a parameter is a closed-form count of the backward uses that
// ran, and a counting Offloader checks each gradient is reduced exactly once (I7).
#include <algorithm>
#include <doctest/doctest.h>

#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "../support/impl_family.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/testing/invariants.hpp"

namespace graph_test {

using namespace zshard;

// An on-device Offloader that also records every reduced gradient it is handed.
template <class Backend, class Comm>
class counting_impl : public offload::on_device_impl<Backend, Comm> {
 public:
  counting_impl(param_store<Backend>& store, Comm& comm, const optim::adamw_config& hyper, const offload_config& oc)
      : offload::on_device_impl<Backend, Comm>(store, comm, hyper, oc), calls(store.size(), 0), sums(store.size(), 0.0) {}
  void accumulate_grad(param_id p, const float* g, std::size_t n, typename Backend::stream& ready_on) {
    ++calls[p];
    for (std::size_t i = 0; i < n; ++i) sums[p] += g[i];
    offload::on_device_impl<Backend, Comm>::accumulate_grad(p, g, n, ready_on);
  }
  std::vector<int> calls;
  std::vector<double> sums;
};
using counting_offloader = test_support::family<offloader_tag, counting_impl>;

template <class Tracker = track::use_counter, class Prefetcher = prefetch::trace>
struct test_policies : default_policies {
  using offloader = counting_offloader;
  using hook_tracker = Tracker;
  using prefetcher = Prefetcher;
};

struct use {
  module_id module;
  bool counted = true;       // false: a no-grad forward
  bool checkpointed = false; // backward recomputes it first
  bool skip_backward = false;// counted, but its backward never runs (swept)
  int nested = -1;           // index of a later use run inside this one's scope (forward and backward)
};

struct graph {
  std::vector<std::int64_t> param_sizes;
  std::vector<bool> trainable;
  std::vector<std::vector<param_id>> modules;
  std::vector<use> program;  // per micro-batch
  int micro_batches = 1;
  int steps = 2;
  engine_config cfg{};
  std::string describe() const;
};

// Parameters no module lists go into one extra module the program never runs (a module that
// exists but is not called in a step), since a registered parameter must belong to a module.
inline model_spec make_spec(const graph& g) {
  model_spec spec;
  std::vector<param_id> unlisted;
  for (std::size_t p = 0; p < g.param_sizes.size(); ++p) {
    bool listed = false;
    for (const auto& m : g.modules)
      for (param_id q : m) listed = listed || q == param_id(p);
    if (!listed) unlisted.push_back(param_id(p));
  }
  for (std::size_t p = 0; p < g.param_sizes.size(); ++p)
    spec.add_param("p" + std::to_string(p), {g.param_sizes[p]},
                   {.trainable = g.trainable[p], .init = [p](std::int64_t i) { return float(p) * 1000.0f + float(i); }});
  for (std::size_t m = 0; m < g.modules.size(); ++m) spec.add_module("m" + std::to_string(m), g.modules[m]);
  if (!unlisted.empty()) spec.add_module("never_called", unlisted);
  return spec;
}

// Expected backward uses per parameter in one micro-batch.
inline std::vector<int> expected_uses(const graph& g) {
  std::vector<int> n(g.param_sizes.size(), 0);
  for (const auto& u : g.program)
    if (u.counted && !u.skip_backward)
      for (param_id p : g.modules[u.module]) n[p] += g.trainable[p] ? 1 : 0;
  return n;
}

// Runs the graph on `world` thread ranks and checks, on every rank: gathered values inside
// every scope, resident elements within budget, invariants after every step, and the reduced
// gradients against the closed-form counts.
template <class Policies = test_policies<>>
void run_and_check(const graph& g, int world) {
  const model_spec spec = make_spec(g);
  const auto uses = expected_uses(g);
  std::mutex mu;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, spec, g.cfg);
    std::vector<std::vector<float>> truth(spec.params().size());
    std::vector<std::string> failures;
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok) failures.push_back(what);
    };
    auto check_scope = [&](const auto& scope, module_id m) {
      for (std::size_t k = 0; k < g.modules[m].size(); ++k) {
        const param_id p = g.modules[m][k];
        const auto v = scope.param(k);
        std::vector<float> got(v.numel());
        convert(v.data(), v.type(), got.data(), dtype::f32, v.numel());
        expect(got == truth[p], "scope of m" + std::to_string(m) + ": p" + std::to_string(p) + " not gathered right");
      }
      const std::size_t live = g.cfg.prefetch.max_live_numel;
      expect(eng.resident_numel() <= live || g.cfg.prefetch.allow_oversized_module, "resident above max_live_numel");
    };
    // opens use i (and, nested inside it, its chain), runs `body` innermost-first on close
    auto forward = [&](auto&& self, std::size_t i) -> void {
      const use& u = g.program[i];
      auto scope = eng.forward(u.module, u.counted ? use_kind::counted : use_kind::no_grad);
      check_scope(scope, u.module);
      if (u.nested >= 0) self(self, std::size_t(u.nested));
    };
    // A nested use of a module whose backward scope is open runs after that scope closes: two
    // backward scopes of one module at once are a usage error (the engine refuses them).
    std::vector<module_id> open_backward;
    auto backward = [&](auto&& self, std::size_t i) -> void {
      const use& u = g.program[i];
      if (u.checkpointed) {
        auto r = eng.recompute(u.module);
        check_scope(r, u.module);
      }
      const bool nests = u.nested >= 0 && g.program[std::size_t(u.nested)].counted &&
                         !g.program[std::size_t(u.nested)].skip_backward;
      const module_id inner = nests ? g.program[std::size_t(u.nested)].module : module_id(0);
      const bool defer = nests && (inner == u.module || std::find(open_backward.begin(), open_backward.end(), inner) !=
                                                            open_backward.end());
      {
        auto scope = eng.backward(u.module);
        check_scope(scope, u.module);
        for (std::size_t k = 0; k < g.modules[u.module].size(); ++k)
          if (g.trainable[g.modules[u.module][k]]) {
            float* gr = scope.grad_data(k);
            for (std::size_t e = 0; e < scope.param(k).numel(); ++e) gr[e] += 1.0f;
          }
        open_backward.push_back(u.module);
        if (nests && !defer) self(self, std::size_t(u.nested));
        open_backward.pop_back();
      }
      if (defer) self(self, std::size_t(u.nested));
    };
    std::vector<bool> is_nested(g.program.size(), false);
    for (const auto& u : g.program)
      if (u.nested >= 0) is_nested[std::size_t(u.nested)] = true;
    auto& off = const_cast<typename decltype(eng)::offloader_type&>(eng.offloader());
    for (int step = 0; step < g.steps; ++step) {
      for (param_id p = 0; p < spec.params().size(); ++p) truth[p] = eng.gather_param(p);
      std::fill(off.calls.begin(), off.calls.end(), 0);
      std::fill(off.sums.begin(), off.sums.end(), 0.0);
      for (int mb = 0; mb < g.micro_batches; ++mb) {
        for (std::size_t i = 0; i < g.program.size(); ++i)
          if (!is_nested[i]) forward(forward, i);
        eng.begin_backward();
        for (std::size_t i = g.program.size(); i-- > 0;)
          if (!is_nested[i] && g.program[i].counted && !g.program[i].skip_backward) backward(backward, i);
        eng.end_backward();
      }
      for (param_id p = 0; p < spec.params().size(); ++p) {
        // a parameter reaches the Reducer once per micro-batch in which any backward of it ran
        expect(off.calls[p] == (uses[p] > 0 ? g.micro_batches : 0),
               "p" + std::to_string(p) + " reduced " + std::to_string(off.calls[p]) + " times (I7)");
        const auto& l = eng.layout(p);
        const double owned = double(l.owned_end(comm.rank()) - l.owned_begin(comm.rank()));
        expect(off.sums[p] == double(uses[p]) * g.micro_batches * owned,
               "p" + std::to_string(p) + " reduced gradient sum " + std::to_string(off.sums[p]) + ", expected " +
                   std::to_string(double(uses[p]) * g.micro_batches * owned));
      }
      // I3: exactly the counted uses whose backward never ran are swept and reported
      const step_report report = eng.step();
      std::vector<std::int64_t> swept(g.modules.size() + 1, 0), want(g.modules.size() + 1, 0);
      for (const auto& s : report.swept) swept[s.module] += s.pending_uses;
      for (const auto& u : g.program)
        if (u.counted && u.skip_backward) want[u.module] += g.micro_batches;
      expect(swept == want, "swept uses differ from the uses whose backward never ran (I1/I3)");
      for (const auto& v : testing::step_boundary_violations(eng)) expect(false, v);
    }
    std::lock_guard lock(mu);
    for (const auto& f : failures) FAIL_CHECK(f << "  [rank " << comm.rank() << " of " << world << "] " << g.describe());
    CHECK(failures.empty());
  });
}

inline std::string graph::describe() const {
  std::string s = "graph{params:";
  for (std::size_t p = 0; p < param_sizes.size(); ++p)
    s += " " + std::to_string(param_sizes[p]) + (trainable[p] ? "" : "(frozen)");
  s += "; modules:";
  for (const auto& m : modules) {
    s += " [";
    for (param_id p : m) s += "p" + std::to_string(p) + " ";
    s += "]";
  }
  s += "; program:";
  for (const auto& u : program)
    s += " m" + std::to_string(u.module) + (u.counted ? "" : "(no-grad)") + (u.checkpointed ? "(ckpt)" : "") +
         (u.skip_backward ? "(unused)" : "") + (u.nested >= 0 ? "(nests " + std::to_string(u.nested) + ")" : "");
  s += "; micro " + std::to_string(micro_batches) + ", max_live " + std::to_string(cfg.prefetch.max_live_numel) +
       ", prefetch " + std::to_string(cfg.prefetch.prefetch_numel) + ", reuse " +
       std::to_string(cfg.prefetch.max_reuse_distance) + ", bucket " + std::to_string(cfg.reduce.reduce_bucket_numel) +
       ", persist " + std::to_string(cfg.partition.persistence_threshold_numel) + "}";
  return s;
}

}  // namespace graph_test

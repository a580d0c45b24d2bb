// The trace-based Prefetcher: records the first step, then gathers ahead within
// prefetch_numel and max_live_numel; a model that leaves the trace drops to on-demand (said
// once, counted) and is re-recorded; results never depend on what was prefetched.
#include <doctest/doctest.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "../support/policies.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/partition/even_partitioner.hpp"
#include "zshard/prefetch/trace_prefetcher.hpp"
#include "zshard/prefetch/pass_trace_prefetcher.hpp"
#include "zshard/testing/invariants.hpp"

using namespace zshard;

namespace {

constexpr int modules = 5;
constexpr std::int64_t numel = 30;  // padded to 30 for world 1, 2, 3

model_spec chain() {
  model_spec spec;
  for (int m = 0; m < modules; ++m) spec.add_module("m" + std::to_string(m), {spec.add_param("w" + std::to_string(m), {numel})});
  return spec;
}

template <class P>
using policies_with = test_support::with_prefetcher<P>;

struct observed {
  std::vector<std::vector<std::size_t>> resident;  // per step, resident numel inside each scope
  std::vector<std::vector<float>> params;
  std::size_t divergences = 0;
  std::vector<std::string> log;
};

template <class Prefetcher>
observed run(int world, engine_config cfg, const std::vector<std::vector<module_id>>& orders) {
  observed out;
  std::mutex mu;
  cfg.log = [&](const std::string& line) {
    std::lock_guard lock(mu);
    out.log.push_back(line);
  };
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, policies_with<Prefetcher>> eng(backend, comm, chain(), cfg);
    std::vector<std::vector<std::size_t>> resident;
    for (const auto& order : orders) {
      resident.emplace_back();
      for (module_id m : order) {
        auto s = eng.forward(m);
        resident.back().push_back(eng.resident_numel());
      }
      eng.begin_backward();
      for (std::size_t i = order.size(); i-- > 0;) {
        auto g = eng.backward(order[i]);
        resident.back().push_back(eng.resident_numel());
        g.grad_data(0)[std::size_t(order[i])] += float(i + 1);
      }
      eng.end_backward();
      eng.step();
      for (const auto& v : testing::step_boundary_violations(eng)) FAIL_CHECK(v);
    }
    std::vector<std::vector<float>> params;
    for (param_id p = 0; p < modules; ++p) params.push_back(eng.gather_param(p));
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      out.resident = resident;
      out.params = params;
      if constexpr (std::is_same_v<Prefetcher, prefetch::trace>) out.divergences = eng.prefetcher().divergences();
    }
  });
  return out;
}

}  // namespace

TEST_CASE("the first step records; later steps gather ahead within prefetch_numel and max_live_numel") {
  const std::vector<module_id> order = {0, 1, 2, 3, 4};
  for (int world : {1, 2, 3}) {
    engine_config cfg;
    cfg.prefetch.prefetch_numel = 2 * numel;  // two modules ahead
    cfg.prefetch.max_live_numel = 10 * numel;
    const auto r = run<prefetch::trace>(world, cfg, {order, order, order});
    INFO("world " << world);
    CHECK(r.resident[0][0] == numel);      // recording: on demand
    CHECK(r.resident[1][0] == 3 * numel);  // replay: m0 in use, m1 and m2 gathered ahead
    for (std::size_t s = 1; s < 3; ++s)
      for (std::size_t i = 0; i < r.resident[s].size(); ++i) CHECK(r.resident[s][i] <= 3 * numel);
    // a tight budget wins over prefetch_numel
    cfg.prefetch.max_live_numel = 2 * numel;
    const auto tight = run<prefetch::trace>(world, cfg, {order, order});
    for (const auto& step : tight.resident)
      for (std::size_t x : step) CHECK(x <= 2 * numel);
    CHECK(tight.resident[1][0] == 2 * numel);
    CHECK(r.divergences == 0);
    CHECK(r.log.empty());
  }
}

TEST_CASE("what is prefetched never changes the result") {
  const std::vector<module_id> order = {0, 1, 2, 3, 4};
  engine_config cfg;
  cfg.prefetch.prefetch_numel = 3 * numel;
  cfg.prefetch.max_reuse_distance = 2 * numel;
  const auto traced = run<prefetch::trace>(3, cfg, {order, order, order});
  const auto on_demand = run<prefetch::on_demand>(3, cfg, {order, order, order});
  CHECK(traced.params == on_demand.params);
}

TEST_CASE("leaving the trace drops to on-demand, says so once, counts, and re-records") {
  const std::vector<module_id> a = {0, 1, 2, 3, 4}, b = {0, 2, 1, 4, 3};
  engine_config cfg;
  cfg.prefetch.prefetch_numel = 2 * numel;
  // steps: record a, replay a, leave (b), record b, replay b, leave again (a)
  const auto r = run<prefetch::trace>(2, cfg, {a, a, b, b, b, a});
  CHECK(r.divergences == 2);
  REQUIRE(r.log.size() == 2);  // once per rank, tagged with it
  for (const auto& line : r.log) {
    CHECK(line.find("left its recorded trace") != std::string::npos);
    // where and how: the module and its use kind, against what the trace expected there
    CHECK(line.find("module 'm2' (counted) at scope #1 where the trace has 'm1' (counted)") != std::string::npos);
  }
  CHECK((r.log[0].rfind("rank 0: ", 0) == 0 || r.log[1].rfind("rank 0: ", 0) == 0));
  CHECK(r.resident[2].back() == numel);       // after the divergence: on demand
  CHECK(r.resident[3][0] == numel);           // re-recording b
  CHECK(r.resident[4][0] == 3 * numel);       // replaying b: prefetching again
  const auto on_demand = run<prefetch::on_demand>(2, cfg, {a, a, b, b, b, a});
  CHECK(r.params == on_demand.params);
}

// keep_after_scope through the trace index, against a scan of the trace that follows its
// definition literally: p is kept when a scope from the current position on uses it and the
// scopes before that one hold at most max_reuse_distance gathered elements.
TEST_CASE("trace prefetcher: reuse advice from the index equals a scan of the trace, random models") {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 30; ++trial) {
    model_spec spec;
    const int n_params = 3 + int(rng() % 12), n_modules = 2 + int(rng() % 10);
    std::vector<param_id> ps;
    for (int p = 0; p < n_params; ++p)
      ps.push_back(spec.add_param("p" + std::to_string(p), {std::int64_t(1 + rng() % 40)}));
    for (int m = 0; m < n_modules; ++m) {
      std::vector<param_id> mine;
      for (param_id p : ps)
        if (rng() % 3 == 0) mine.push_back(p);
      spec.add_module("m" + std::to_string(m), mine);
    }
    engine_config cfg;
    cfg.partition.persistence_threshold_numel = 8;  // some replicated: they hold no gathered elements
    cfg.prefetch.max_reuse_distance = rng() % 120;
    std::vector<shard_layout> layouts;
    for (param_id p = 0; p < spec.params().size(); ++p)
      layouts.push_back(partition::even{}.layout(param_identity::of(spec, p, dtype::f32), 2, cfg.partition));
    std::vector<std::size_t> module_numel(spec.modules().size(), 0);
    for (module_id m = 0; m < spec.modules().size(); ++m)
      for (param_id p : spec.module(m).params)
        if (!layouts[p].replicated) module_numel[m] += layouts[p].padded_numel;
    std::vector<module_id> order;  // modules repeat, as shared blocks and recomputes do
    for (int i = 0; i < 25; ++i) order.push_back(module_id(rng() % spec.modules().size()));

    prefetch::trace t;
    t.reset(spec, layouts, cfg.prefetch, log_sink{});
    std::vector<param_id> ahead;
    for (module_id m : order) t.on_scope_enter(m, use_kind::counted, ahead);
    t.on_step();
    REQUIRE(t.replaying());
    for (std::size_t pos = 0; pos < order.size(); ++pos) {
      ahead.clear();
      t.on_scope_enter(order[pos], use_kind::counted, ahead);  // now at pos + 1
      for (param_id p = 0; p < spec.params().size(); ++p) {
        bool want = false;
        std::size_t distance = 0;
        for (std::size_t i = pos + 1; i < order.size() && distance <= cfg.prefetch.max_reuse_distance; ++i) {
          const auto& used = spec.module(order[i]).params;
          if (std::find(used.begin(), used.end(), p) != used.end()) {
            want = true;
            break;
          }
          distance += module_numel[order[i]];
        }
        INFO("trial " << trial << " position " << pos << " param " << p);
        REQUIRE(t.keep_after_scope(p) == want);
      }
    }
    t.on_step();
  }
}

TEST_CASE("pass_trace: a periodic no-grad evaluation has its own trace: no divergence, prefetching stays on") {
  // steps 0..5; an evaluation (no-grad forward over every module) after steps 1 and 3
  engine_config cfg;
  cfg.prefetch.prefetch_numel = 2 * numel;
  cfg.prefetch.max_live_numel = 10 * numel;
  std::vector<std::string> log;
  std::mutex mu;
  cfg.log = [&](const std::string& line) {
    std::lock_guard lock(mu);
    log.push_back(line);
  };
  std::vector<std::size_t> first_scope_resident, eval_first_scope_resident;
  std::vector<std::vector<float>> params;
  run_ranks(2, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, policies_with<prefetch::pass_trace>> eng(backend, comm, chain(), cfg);
    std::vector<std::size_t> first, eval_first;
    for (int step = 0; step < 6; ++step) {
      for (module_id m = 0; m < modules; ++m) {
        auto s = eng.forward(m);
        if (m == 0) first.push_back(eng.resident_numel());
      }
      eng.begin_backward();
      for (module_id m = modules; m-- > 0;) {
        auto g = eng.backward(m);
        g.grad_data(0)[0] += 1.0f;
      }
      eng.end_backward();
      eng.step();
      if (step == 1 || step == 3) {
        for (module_id m = 0; m < modules; ++m) {
          auto s = eng.forward(m, use_kind::no_grad);
          if (m == 0) eval_first.push_back(eng.resident_numel());
        }
        CHECK(eng.prefetcher().replaying());  // the training trace is untouched
      }
      for (const auto& v : testing::step_boundary_violations(eng)) FAIL_CHECK(v);
    }
    CHECK(eng.prefetcher().divergences() == 0);
    CHECK(eng.prefetcher().no_grad_replaying());
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      first_scope_resident = first;
      eval_first_scope_resident = eval_first;
    }
  });
  CHECK(log.empty());
  REQUIRE(first_scope_resident.size() == 6);
  CHECK(first_scope_resident[0] == numel);  // recording
  for (std::size_t s = 1; s < 6; ++s) CHECK(first_scope_resident[s] == 3 * numel);  // replay, eval or not
  REQUIRE(eval_first_scope_resident.size() == 2);
  CHECK(eval_first_scope_resident[0] == numel);      // the first evaluation records
  CHECK(eval_first_scope_resident[1] == 3 * numel);  // the second replays: m1, m2 gathered ahead
}

TEST_CASE("an evaluation pass that leaves the default trace says which policy keeps prefetching through it") {
  std::mutex mu;
  std::vector<std::string> log;
  engine_config cfg;
  cfg.prefetch.prefetch_numel = 2 * numel;
  cfg.log = [&](const std::string& line) {
    std::lock_guard lock(mu);
    log.push_back(line);
  };
  run_ranks(2, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, policies_with<prefetch::trace>> eng(backend, comm, chain(), cfg);
    for (int step = 0; step < 2; ++step) {  // record, replay
      for (module_id m = 0; m < modules; ++m) auto s = eng.forward(m);
      eng.begin_backward();
      for (module_id m = modules; m-- > 0;) auto g = eng.backward(m);
      eng.end_backward();
      eng.step();
    }
    for (module_id m = 0; m < modules; ++m) auto s = eng.forward(m, use_kind::no_grad);  // an evaluation
  });
  std::vector<std::string> said;
  for (const auto& line : log)
    if (line.find("left its recorded trace") != std::string::npos) said.push_back(line);
  REQUIRE(said.size() == 2);  // once per rank
  for (const auto& line : said) {
    CHECK(line.find("module 'm0' (no_grad) at scope #0 where the trace has 'm0' (counted)") != std::string::npos);
    CHECK(line.find("a no-grad pass (an evaluation?) between training steps: prefetch::pass_trace") != std::string::npos);
  }
}

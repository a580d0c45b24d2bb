#pragma once
// The toy model of the engine tests (tests/engine/toy_model.hpp) trained step by step on
// thread ranks, with both Offloaders, so that checkpoint tests can stop, save, load and go on.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../engine/toy_training.hpp"
#include "../support/policies.hpp"
#include "zshard/checkpoint/checkpoint.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/state/param_access.hpp"

namespace ckpt_test {

using host_adam_policies = test_support::host_offload_policies;

inline zshard::engine_config engine_options(zshard::dtype t = zshard::dtype::f32, std::size_t align = 1,
                                            std::size_t threshold = 8) {
  zshard::engine_config c;
  c.param_dtype = t;
  c.adamw.lr = 1e-2f;
  c.adamw.weight_decay = 0.1f;
  c.partition.persistence_threshold_numel = threshold;
  c.partition.shard_alignment_numel = align;
  c.reduce.reduce_bucket_numel = 100;
  c.offload.host_threads = 1;
  c.log = [](const std::string&) {};
  return c;
}

// Global steps [first, first + count) of toy training; rank r takes its rows of each batch.
// global_rows = 0: 3 rows per rank; else a global batch of that many rows (divisible by the
// world size), the same whatever the world size.
template <class Engine>
void train_steps(Engine& eng, const toy::ids& id, const toy::config& mc, int first, int count, int global_rows = 0) {
  // data parallel over the whole job (every rank of every replica group under hybrid sharding)
  auto& job = zshard::checkpoint::job_comm(eng);
  const int world = job.size(), rank = job.rank();
  const int rows = global_rows ? global_rows / world : 3;
  for (int step = first; step < first + count; ++step) {
    const toy::batch global = toy::make_batch(mc.vocab, std::uint64_t(step), world * rows);
    toy::run_micro_batch(eng, mc, id, toy::slice(global, rank * rows, rows), false);
    eng.step();
  }
}

// Every field of every parameter, gathered (collective); frozen parameters: working only.
struct full_state {
  std::vector<std::vector<float>> working, master, m, v;
  std::int64_t step = 0;
  float lr = 0;
  friend bool operator==(const full_state&, const full_state&) = default;
};

template <class Engine>
full_state gather_all(Engine& eng) {
  full_state s;
  for (zshard::param_id p = 0; p < eng.spec().params().size(); ++p) {
    s.working.push_back(zshard::gather_field(eng, p, zshard::state_field::working));
    if (!eng.spec().params()[p].trainable) continue;
    s.master.push_back(zshard::gather_field(eng, p, zshard::state_field::master));
    s.m.push_back(zshard::gather_field(eng, p, zshard::state_field::m));
    s.v.push_back(zshard::gather_field(eng, p, zshard::state_field::v));
  }
  s.step = eng.steps_taken();
  s.lr = eng.lr();
  return s;
}

// Bitwise: float == would take -0 for +0 and fail on NaN.
inline bool same_bits(const full_state& a, const full_state& b) {
  auto eq = [](const std::vector<std::vector<float>>& x, const std::vector<std::vector<float>>& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i].size() != y[i].size() || std::memcmp(x[i].data(), y[i].data(), x[i].size() * 4) != 0) return false;
    return true;
  };
  return eq(a.working, b.working) && eq(a.master, b.master) && eq(a.m, b.m) && eq(a.v, b.v) && a.step == b.step &&
         a.lr == b.lr;
}

// Runs fn(eng, id) on `world` thread ranks, each with a fresh engine; rank 0's result of
// fn is returned.
template <class Policies = zshard::default_policies, class Fn>
auto on_ranks(int world, const zshard::engine_config& cfg, Fn&& fn, const toy::config& mc = {},
              std::chrono::milliseconds timeout = zshard::default_comm_timeout) {
  using engine_t = zshard::engine<zshard::host_backend, zshard::thread_comm, Policies>;
  using result_t = decltype(fn(std::declval<engine_t&>(), std::declval<const toy::ids&>()));
  result_t out{};
  std::mutex mu;
  zshard::run_ranks(
      world,
      [&](zshard::thread_comm& comm) {
        toy::ids id;
        zshard::host_backend backend;
        engine_t eng(backend, comm, toy::make_spec(mc, id), cfg);
        auto r = fn(eng, static_cast<const toy::ids&>(id));
        if (comm.rank() == 0) {
          std::lock_guard lock(mu);
          out = std::move(r);
        }
      },
      timeout);
  return out;
}

// The checkpoint in `dir` loaded into fresh engines (Policies') on `world` ranks under cfg:
// every field as loaded.
template <class Policies = zshard::default_policies>
full_state loaded_state(int world, const zshard::engine_config& cfg, const std::string& dir,
                        const toy::config& mc = {}) {
  return on_ranks<Policies>(
      world, cfg,
      [&](auto& eng, const toy::ids&) {
        zshard::checkpoint::load(eng, dir);
        return gather_all(eng);
      },
      mc);
}

// ck::load(eng, dir, lo) that is expected to fail: its error ("" when it loaded); the engine's
// state and update counts are checked to be as they were before it (a failed load touches none).
template <class Engine>
std::string load_error_untouched(Engine& eng, const std::string& dir, const zshard::checkpoint::load_options& lo = {}) {
  const full_state before = gather_all(eng);
  const auto counts = eng.update_counts();
  std::string what;
  try {
    zshard::checkpoint::load(eng, dir, lo);
  } catch (const zshard::error& e) {
    what = e.what();
  }
  CHECK(same_bits(before, gather_all(eng)));
  CHECK(eng.update_counts() == counts);
  return what;
}

// What each rank saw, collected from the ranks' threads; agreed() is the one value all of them
// saw (a test of a collective failure: every rank fails with the same words).
class rank_errors {
 public:
  void add(std::string what) {
    std::lock_guard lock(mu_);
    errors_.push_back(std::move(what));
  }
  std::string agreed(int world) const {
    REQUIRE(errors_.size() == std::size_t(world));
    for (const auto& e : errors_) CHECK(e == errors_[0]);
    return errors_[0];
  }

 private:
  std::mutex mu_;
  std::vector<std::string> errors_;
};

// A global batch that every world size of these tests (1..8) divides: the same data at each.
inline constexpr int global_rows = 840;

// `got` within 1e-5 of `want` (2-norm, relative, per parameter).
inline void check_close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t p = 0; p < got.size(); ++p) {
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < got[p].size(); ++i) {
      diff += std::pow(double(got[p][i]) - want[p][i], 2);
      norm += std::pow(double(want[p][i]), 2);
    }
    CHECK(std::sqrt(diff) <= 1e-5 * std::sqrt(norm));
  }
}

// The float64 single-process reference: `steps` uninterrupted steps of global_rows rows under cfg.
inline std::vector<std::vector<float>> reference_params(const zshard::engine_config& cfg, int steps = 4) {
  toy::train_options ro;
  ro.world = 1;
  ro.rows = global_rows;
  ro.steps = steps;
  ro.engine = cfg;
  return toy::train_reference(ro).params;
}

// A checkpoint of global steps 0 and 1 loaded into fresh engines on `world` ranks under cfg, which
// then train steps 2 and 3: every field as loaded, and every parameter after training.
struct loaded_then_trained {
  full_state loaded;
  std::vector<std::vector<float>> trained;
};
inline loaded_then_trained load_and_train(int world, const zshard::engine_config& cfg, const std::string& dir,
                              int saved_world_size) {
  return on_ranks(world, cfg, [&](auto& eng, const toy::ids& id) {
    const auto info = zshard::checkpoint::load(eng, dir, {.chunk_bytes = 256});  // many chunks per shard
    CHECK(info.saved_world_size == saved_world_size);
    loaded_then_trained out{gather_all(eng), {}};
    train_steps(eng, id, {}, 2, 2, global_rows);
    out.trained = toy::all_params(eng);
    return out;
  });
}

}  // namespace ckpt_test

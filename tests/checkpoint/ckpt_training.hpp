#pragma once
// The toy model of the engine tests (tests/engine/toy_model.hpp) trained step by step on
// thread ranks, with both Offloaders, so that checkpoint tests can stop, save, load and go on.
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../engine/toy_training.hpp"
#include "zshard/checkpoint/checkpoint.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/state/param_access.hpp"

namespace ckpt_test {

struct host_adam_policies : zshard::default_policies {
  using offloader = zshard::offload::host_adam;
};

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

}  // namespace ckpt_test

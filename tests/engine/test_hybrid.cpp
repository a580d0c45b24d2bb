// Hybrid sharding (partition/hybrid_layout.hpp, engine/hybrid_groups.hpp): ranks form
// replicas x shard_group; training equals single-process training (the float64 reference) with
// activation checkpointing, a no-grad pass and a tied weight; replicas stay bitwise identical;
// each rank holds what plain ZeRO-3 over one shard group holds; bad layouts fail at
// construction on every rank with a clear message.
#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <mutex>
#include <string>

#include "../support/early_return.hpp"
#include "equivalence_check.hpp"
#include "hybrid_training.hpp"
#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"

namespace {

struct hybrid_run {
  toy::train_result rank0;
  std::vector<std::vector<std::vector<float>>> every_rank;  // [world rank][param] full values
  std::vector<std::size_t> sharded_bytes;                   // per world rank
};

// `separate_reduce`: gradient reductions on a second communicator of the world (engine's
// reduce_comm), which the engine splits too.
hybrid_run train_hybrid(const toy::train_options& o, int group, bool separate_reduce = false) {
  hybrid_run out;
  out.every_rank.resize(std::size_t(o.world));
  out.sharded_bytes.resize(std::size_t(o.world));
  std::mutex mu;
  auto cfg = o;
  cfg.engine.hybrid.shard_group_size = group;
  zshard::run_ranks(o.world, [&](zshard::thread_comm& comm) {
    toy::ids id;
    zshard::host_backend backend;
    std::optional<zshard::thread_comm> reduce;
    if (separate_reduce) reduce.emplace(comm.split(0, comm.rank()));
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, reduce ? *reduce : comm,
                                                                  toy::make_spec(o.model, id), cfg.engine);
    REQUIRE(eng.separate_reduce_comm() == separate_reduce);
    REQUIRE(eng.comm().size() == (group == 0 ? o.world : group));
    REQUIRE(eng.world_comm().size() == o.world);
    toy::train_checkpointed_rank(eng, comm.rank(), cfg, mu, out.rank0, &out.every_rank);
    out.sharded_bytes[std::size_t(comm.rank())] = eng.ledger().peak(zshard::mem_category::sharded_params) +
                                                  eng.ledger().peak(zshard::mem_category::optimizer_state);
  });
  return out;
}

toy::train_options options(int world, int variant) {
  auto o = toy::base_options(world);
  if (variant == 1) o.micro_batches = 2;
  if (variant == 2) {
    o.micro_batches = 2;
    o.engine.clip_norm = 0.05;
  }
  return o;
}

}  // namespace

TEST_CASE("hybrid sharding equals the float64 single-process reference (checkpointing, no-grad pass, tied weight)") {
  struct shape {
    int replicas, group;
  };
  for (const shape sh : {shape{2, 2}, shape{2, 4}, shape{3, 2}}) {
    for (int variant = 0; variant < 3; ++variant) {
      const int world = sh.replicas * sh.group;
      const auto o = options(world, variant);
      const std::string what = std::to_string(sh.replicas) + " x " + std::to_string(sh.group) + ", variant " +
                               std::to_string(variant);
      const auto got = train_hybrid(o, sh.group);
      toy::check_equal(got.rank0, toy::train_reference(o), zshard::dtype::f32, what);
      INFO(what);
      // every rank, in every replica, ends with bitwise the same parameters
      for (int r = 1; r < world; ++r) CHECK(got.every_rank[std::size_t(r)] == got.every_rank[0]);
      if (variant == 2)
        for (const auto& r : got.rank0.reports) CHECK(r.clip_coefficient < 1.0);
    }
  }
}

TEST_CASE("hybrid: each rank holds a shard group's share, as plain ZeRO-3 over the group would") {
  const auto o = options(4, 0);
  const auto hybrid = train_hybrid(o, 2);  // 2 x 2
  auto flat_o = options(2, 0);
  const auto flat = train_hybrid(flat_o, 0);  // plain ZeRO-3 over 2 ranks
  for (int r = 0; r < 4; ++r) CHECK(hybrid.sharded_bytes[std::size_t(r)] == flat.sharded_bytes[std::size_t(r % 2)]);
  const auto full = train_hybrid(options(4, 0), 4);  // shard_group_size = world: plain ZeRO-3
  CHECK(full.sharded_bytes[0] < hybrid.sharded_bytes[0]);
}

TEST_CASE("shard_group_size = world is plain ZeRO-3, bit for bit") {
  const auto o = options(4, 1);
  const auto a = train_hybrid(o, 0), b = train_hybrid(o, 4);
  CHECK(a.every_rank == b.every_rank);
  for (std::size_t s = 0; s < a.rank0.reports.size(); ++s)
    CHECK(a.rank0.reports[s].grad_norm == b.rank0.reports[s].grad_norm);
}

namespace {

// Builds an engine on `world` thread ranks with a per-rank hybrid config; returns every rank's
// error message (empty when it built).
std::vector<std::string> build_errors(int world, const std::function<zshard::hybrid_config(int)>& hybrid_of) {
  std::vector<std::string> msgs(static_cast<std::size_t>(world));
  std::mutex mu;
  try {
    zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
      toy::ids id;
      zshard::host_backend backend;
      zshard::engine_config cfg;
      cfg.hybrid = hybrid_of(comm.rank());
      try {
        zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, toy::make_spec({}, id), cfg);
      } catch (const zshard::error& e) {
        std::lock_guard lock(mu);
        msgs[std::size_t(comm.rank())] = std::string(e.what()) + (e.kind() == zshard::error_kind::config ? " [config]" : " [other]");
      }
    });
  } catch (const zshard::error& e) {
    FAIL("run_ranks threw: " << e.what());
  }
  return msgs;
}

}  // namespace

TEST_CASE("hybrid: bad layouts fail at construction on every rank, naming the problem") {
  SUBCASE("a group size that does not divide the world") {
    const auto msgs = build_errors(4, [](int) { return zshard::hybrid_config{.shard_group_size = 3}; });
    for (const auto& m : msgs) CHECK(m.find("does not divide the world of 4 ranks") != std::string::npos);
  }
  SUBCASE("ranks that disagree on the group size") {
    const auto msgs = build_errors(4, [](int r) { return zshard::hybrid_config{.shard_group_size = r == 3 ? 4 : 2}; });
    for (const auto& m : msgs) CHECK(m.find("ranks disagree on hybrid.shard_group_size") != std::string::npos);
  }
  SUBCASE("one rank flat, the others hybrid") {
    const auto msgs = build_errors(4, [](int r) { return zshard::hybrid_config{.shard_group_size = r == 1 ? 0 : 2}; });
    for (const auto& m : msgs) CHECK(m.find("ranks disagree on hybrid.shard_group_size") != std::string::npos);
  }
  SUBCASE("a group that takes part of one node and part of another") {
    // 6 ranks on 2 nodes of 3; groups of 2: group 1 is ranks 2 (node 0) and 3 (node 1)
    const auto msgs =
        build_errors(6, [](int) { return zshard::hybrid_config{.shard_group_size = 2, .ranks_per_node = 3}; });
    for (const auto& m : msgs) {
      CHECK(m.find("shard group 1 (ranks 2..3) takes part of a node and part of another") != std::string::npos);
      CHECK(m.find("[config]") != std::string::npos);
    }
  }
  SUBCASE("groups of whole nodes, or inside one node, are fine") {
    for (const auto& msgs :
         {build_errors(8, [](int) { return zshard::hybrid_config{.shard_group_size = 4, .ranks_per_node = 2}; }),
          build_errors(8, [](int) { return zshard::hybrid_config{.shard_group_size = 2, .ranks_per_node = 4}; }),
          build_errors(4, [](int) { return zshard::hybrid_config{.shard_group_size = 2}; })})
      for (const auto& m : msgs) CHECK(m.empty());
  }
  SUBCASE("ranks_per_node that does not divide the world") {
    const auto msgs =
        build_errors(4, [](int) { return zshard::hybrid_config{.shard_group_size = 2, .ranks_per_node = 3}; });
    for (const auto& m : msgs) CHECK(m.find("ranks_per_node = 3 does not divide the world") != std::string::npos);
  }
}

namespace {
// A communicator type without split() (a wrapper that does not forward it): the engine cannot
// build hybrid groups on it.
struct no_split_comm {
  using zshard_tag = zshard::communicator_tag;
  zshard::thread_comm* inner;
  int rank() const { return inner->rank(); }
  int size() const { return inner->size(); }
  void all_gather(const void* s, void* d, std::size_t n, zshard::dtype t, zshard::comm_stream cs = {}) {
    inner->all_gather(s, d, n, t, cs);
  }
  void reduce_scatter(const void* s, void* d, std::size_t n, zshard::dtype t, zshard::reduce_op op,
                      zshard::comm_stream cs = {}) {
    inner->reduce_scatter(s, d, n, t, op, cs);
  }
  void all_reduce(const void* s, void* d, std::size_t n, zshard::dtype t, zshard::reduce_op op,
                  zshard::comm_stream cs = {}) {
    inner->all_reduce(s, d, n, t, op, cs);
  }
  void broadcast(void* d, std::size_t n, zshard::dtype t, int root, zshard::comm_stream cs = {}) {
    inner->broadcast(d, n, t, root, cs);
  }
  void barrier(zshard::comm_stream cs = {}) { inner->barrier(cs); }
};
}  // namespace

TEST_CASE("hybrid on a communicator type without split(): a configuration error saying what the type lacks") {
  std::mutex mu;
  std::vector<std::string> msgs;
  zshard::run_ranks(4, [&](zshard::thread_comm& comm) {
    no_split_comm c{&comm};
    zshard::host_backend backend;
    zshard::engine_config cfg;
    cfg.hybrid.shard_group_size = 2;
    toy::ids id;
    try {
      zshard::engine<zshard::host_backend, no_split_comm> eng(backend, c, toy::make_spec({}, id), cfg);
    } catch (const zshard::error& e) {
      CHECK(e.kind() == zshard::error_kind::config);
      std::lock_guard lock(mu);
      msgs.push_back(e.what());
    }
  });
  REQUIRE(msgs.size() == 4);
  for (const auto& m : msgs) {
    CHECK(m.find("hybrid sharding (hybrid.shard_group_size = 2) needs split(color, key) on the engine's communicator "
                 "type, and this type has none") != std::string::npos);
    CHECK(m.find("a wrapper: wrap the inner communicator's split") != std::string::npos);
  }
}

TEST_CASE("hybrid on the null communicator: the layout splits without peers, gathers stay in the group") {
  toy::ids id;
  const auto spec = toy::make_spec({.vocab = 64, .dim = 32, .layers = 2, .repeat_layer1 = false}, id);
  auto bytes = [&](int group) {
    zshard::phantom_backend backend;
    zshard::null_comm world(0, 8);
    zshard::engine_config cfg;
    cfg.hybrid.shard_group_size = group;
    zshard::engine<zshard::phantom_backend, zshard::null_comm> eng(backend, world, spec, cfg);
    for (auto m : {id.embed, id.layer[0], id.layer[1], id.head}) (void)eng.forward(m);
    eng.begin_backward();
    for (auto m : {id.head, id.layer[1], id.layer[0], id.embed}) (void)eng.backward(m);
    eng.end_backward();
    eng.step();
    struct out {
      std::uint64_t group_bytes, replica_bytes, world_bytes;
      int group_size;
    };
    const bool hybrid = eng.replica_comm() != nullptr;
    return out{hybrid ? eng.comm().total_bytes_sent() : 0, hybrid ? eng.replica_comm()->total_bytes_sent() : 0,
               eng.world_comm().total_bytes_sent(), eng.comm().size()};
  };
  const auto h = bytes(4), f = bytes(0);
  CHECK(h.group_size == 4);
  CHECK(f.group_size == 8);
  CHECK(h.group_bytes > 0);
  CHECK(h.replica_bytes > 0);
  CHECK(h.replica_bytes < h.group_bytes);   // only gradients cross groups
  CHECK(h.world_bytes < f.world_bytes / 10);  // the world carries only the step's small exchange
}

TEST_CASE("hybrid with a second communicator for reductions: the same bits") {
  const auto o = options(8, 1);
  const auto one = train_hybrid(o, 4), two = train_hybrid(o, 4, true);  // 2 x 4
  CHECK(one.every_rank == two.every_rank);
}

// Issue 25 point 9: under hybrid sharding most collectives run in a shard group or a replica
// group; a rank that returns early must stop the others there at once, as plain ZeRO-3 does, not
// after the 60 s collective timeout.
TEST_CASE("hybrid 2 x 2: a rank that returns early fails the others at once, naming it") {
  auto o = toy::base_options(4);
  o.engine.hybrid.shard_group_size = 2;
  for (int early : {1, 2}) {
    const auto [msg,
                waited] = test_support::run_with_early_return("rank " + std::to_string(early) + " returned early", [&] {
      zshard::run_ranks(4, [&](zshard::thread_comm& comm) {  // the default 60 s collective timeout
        toy::ids id;
        zshard::host_backend backend;
        zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, toy::make_spec(o.model, id),
                                                                      o.engine);
        for (int step = 0; step < 2; ++step) {
          if (step == 1 && comm.rank() == early) return;  // ends its run before the second step
          const auto global = toy::make_batch(o.model.vocab, std::uint64_t(step), 4 * o.rows);
          toy::run_checkpointed_micro_batch(eng, o.model, id, toy::slice(global, comm.rank() * o.rows, o.rows));
          eng.step();
        }
      });
    });
    INFO(msg);
    CHECK(msg.find("rank " + std::to_string(early) + " ") != std::string::npos);
    CHECK(msg.find("returned from its run_ranks function") != std::string::npos);
    CHECK(waited < std::chrono::seconds(5));
  }
}

// Hybrid sharding on MPI ranks (one process each): replicas x shard groups split from
// MPI_COMM_WORLD. Training with activation checkpointing, a no-grad pass and a tied weight
// equals the float64 single-process reference and thread ranks of the same layout bit for bit;
// every replica ends with the same bits; the launch's nodes (MPI_COMM_TYPE_SHARED) are read and
// checked; ranks that disagree on the layout fail at construction naming it.
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <string>

#include "../engine/equivalence_check.hpp"
#include "../engine/hybrid_training.hpp"
#include "mpi_test_support.hpp"
#include "zshard/comm/mpi_comm.hpp"

using namespace zshard;

namespace {

// Groups of 2 where the world allows it (2 x 2 on 4 processes, 3 x 2 on 6), else of 1 (replicas only).
int group_for(int world) { return world % 2 == 0 && world >= 4 ? 2 : 1; }


}  // namespace

TEST_CASE("hybrid sharding on MPI ranks equals the reference and thread ranks bit for bit") {
  mpi_comm comm(MPI_COMM_WORLD, mpi_test::options());
  const int w = comm.size(), group = group_for(w);
  for (int variant = 0; variant < 2; ++variant) {
    auto o = toy::base_options(w);
    if (variant == 1) o.micro_batches = 2, o.engine.clip_norm = 0.05;
    o.engine.hybrid.shard_group_size = group;
    const std::string what = std::to_string(w / group) + " x " + std::to_string(group) + " on MPI, variant " +
                             std::to_string(variant);
    INFO(what);
    toy::train_result got;
    std::mutex mu;
    std::vector<std::vector<std::vector<float>>> mine(static_cast<std::size_t>(w));
    {
      toy::ids id;
      host_backend backend;
      engine<host_backend, mpi_comm> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
      REQUIRE(eng.comm().size() == group);
      REQUIRE(eng.replica_index() == comm.rank() / group);
      toy::train_checkpointed_rank(eng, comm.rank(), o, mu, got, &mine);
    }
    // every process's final parameters, to rank 0: equal bits everywhere
    const auto& own = mine[std::size_t(comm.rank())];
    std::size_t n = 0;
    for (const auto& p : own) n += p.size();
    std::vector<float> flat, all(n * std::size_t(w));
    for (const auto& p : own) flat.insert(flat.end(), p.begin(), p.end());
    comm.all_gather(flat.data(), all.data(), n, dtype::f32);
    for (int r = 1; r < w; ++r) CHECK(std::memcmp(all.data() + std::size_t(r) * n, all.data(), n * sizeof(float)) == 0);
    if (comm.rank() != 0) continue;
    toy::check_equal(got, toy::train_reference(o), dtype::f32, what + " vs float64 world 1");
    // the same layout on thread ranks
    toy::train_result threads;
    zshard::run_ranks(w, [&](zshard::thread_comm& tc) {
      toy::ids id;
      host_backend backend;
      engine<host_backend, thread_comm> eng(backend, tc, toy::make_spec(o.model, id), o.engine);
      toy::train_checkpointed_rank(eng, tc.rank(), o, mu, threads);
    });
    REQUIRE(threads.params.size() == got.params.size());
    for (std::size_t p = 0; p < got.params.size(); ++p)
      CHECK(std::memcmp(threads.params[p].data(), got.params[p].data(), got.params[p].size() * sizeof(float)) == 0);
    for (std::size_t s = 0; s < got.reports.size(); ++s) CHECK(threads.reports[s].grad_norm == got.reports[s].grad_norm);
  }
}

TEST_CASE("hybrid on MPI: one node read from the launch; disagreeing layouts fail at construction") {
  mpi_comm probe(MPI_COMM_WORLD, mpi_test::options());
  const auto nodes = probe.node_ids();
  REQUIRE(int(nodes.size()) == probe.size());
  for (int id : nodes) CHECK(id == 0);  // mpiexec on one machine: one node, named by its lowest rank
  if (probe.size() < 2) return;
  auto construct = [&](int group, int ranks_per_node) -> std::string {
    mpi_comm comm(MPI_COMM_WORLD, mpi_test::options());
    toy::ids id;
    host_backend backend;
    engine_config cfg;
    cfg.hybrid = {.shard_group_size = group, .ranks_per_node = ranks_per_node};
    try {
      engine<host_backend, mpi_comm> eng(backend, comm, toy::make_spec({}, id), cfg);
    } catch (const error& e) {
      return e.kind() == error_kind::config ? e.message() : "wrong kind: " + std::string(e.what());
    }
    return "constructed";
  };
  const int w = probe.size(), r = probe.rank();
  CHECK(construct(1, 0) == "constructed");
  CHECK(construct(r == 1 ? w : 1, 0).find("ranks disagree on hybrid.shard_group_size") != std::string::npos);
  if (w == 6) {  // 2 nodes of 3 by the configuration: a group of 2 straddles them
    CHECK(construct(2, 3).find("takes part of a node and part of another") != std::string::npos);
  }
  probe.barrier();
}

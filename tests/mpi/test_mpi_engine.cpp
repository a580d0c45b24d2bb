// The engine on MPI ranks (one process each, mpiexec -n 2 and -n 4): sharded training equals
// the float64 single-process reference (world 1) as on threads (I7), and equals thread ranks of
// the same world size bit for bit. Ranks that build different models or schedule-shaping
// settings fail at construction (the engine's fingerprint all-gather, here over MPI).
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <string>

#include "../engine/equivalence_check.hpp"
#include "mpi_test_support.hpp"
#include "zshard/comm/mpi_comm.hpp"

using namespace zshard;

namespace {

toy::train_result train_on_mpi(mpi_comm& comm, const toy::train_options& o) {
  toy::train_result result;  // filled on rank 0
  std::mutex mu;
  toy::ids id;
  host_backend backend;
  engine<host_backend, mpi_comm> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
  toy::train_rank(
      eng, comm.rank(), o, [&](const toy::batch& b, bool inject) { toy::run_micro_batch(eng, o.model, id, b, inject); },
      mu, result);
  return result;
}

void check_bitwise(const toy::train_result& a, const toy::train_result& b) {
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t p = 0; p < a.params.size(); ++p) {
    INFO("parameter #", p);
    REQUIRE(a.params[p].size() == b.params[p].size());
    CHECK(std::memcmp(a.params[p].data(), b.params[p].data(), a.params[p].size() * sizeof(float)) == 0);
  }
  REQUIRE(a.reports.size() == b.reports.size());
  for (std::size_t s = 0; s < a.reports.size(); ++s) {
    CHECK(a.reports[s].grad_norm == b.reports[s].grad_norm);
    CHECK(a.reports[s].skipped == b.reports[s].skipped);
  }
}

}  // namespace

TEST_CASE("engine on MPI ranks equals the single-process reference, and thread ranks bit for bit") {
  mpi_comm comm(MPI_COMM_WORLD, mpi_test::options());
  const int w = comm.size();
  for (int variant = 0; variant < 4; ++variant) {
    auto o = toy::base_options(w);
    dtype working = dtype::f32;
    std::string what = "MPI world " + std::to_string(w);
    if (variant == 1) o.micro_batches = 3, what += ", 3 micro-batches";
    if (variant == 2) o.micro_batches = 2, o.engine.clip_norm = 0.05, what += ", clipping";
    if (variant == 3) o.engine.param_dtype = working = dtype::bf16, o.micro_batches = 2, what += ", bf16";
    const toy::train_result got = train_on_mpi(comm, o);
    if (comm.rank() != 0) continue;  // rank 0 holds the result
    toy::check_equal(got, toy::train_reference(o), working, what + " vs float64 world 1");
    INFO(what, " vs thread ranks");
    check_bitwise(got, toy::train_sharded(o));
  }
}

TEST_CASE("ranks with different models or schedule-shaping settings fail at construction") {
  mpi_comm probe(MPI_COMM_WORLD, mpi_test::options());
  if (probe.size() < 2) return;
  const int r = probe.rank();
  auto construct = [&](const toy::train_options& o) -> std::string {
    mpi_comm comm(MPI_COMM_WORLD, mpi_test::options());
    toy::ids id;
    host_backend backend;
    try {
      engine<host_backend, mpi_comm> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
    } catch (const error& e) {
      return e.kind() == error_kind::config ? e.message() : "wrong kind: " + std::string(e.what());
    }
    return "constructed";
  };
  auto o = toy::base_options(probe.size());
  CHECK(construct(o) == "constructed");
  auto differ = o;
  if (r == 1) differ.model.layers += 1;
  const std::string model_msg = construct(differ);
  CHECK(model_msg.find("ranks disagree on the model") != std::string::npos);
  auto threshold = o;
  if (r == 1) threshold.engine.partition.persistence_threshold_numel += 1;
  CHECK(construct(threshold).find("ranks disagree on partition.persistence_threshold_numel") != std::string::npos);
  probe.barrier();
}

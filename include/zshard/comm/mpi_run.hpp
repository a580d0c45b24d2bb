#pragma once
// Running a zshard program as one MPI process per rank: mpi_session initialises and finalises
// MPI, and run_mpi() is the process-level twin of run_ranks():
//
//   int main(int argc, char** argv) {
//     return zshard::run_mpi(argc, argv, [&](zshard::mpi_comm& comm) { /* one rank's training */ });
//   }
//   $ mpirun -n 4 ./train        (or srun --mpi=pmix -n 4 ./train; README "Across processes and nodes")
//
// Failure ends the job, loudly and quickly: when fn throws on any rank, that rank prints
// "zshard: rank R of N failed: <message>" once to stderr and calls MPI_Abort, which makes the
// launcher end every process of the job with a non-zero status (within seconds; no peer waits
// out its timeout). A rank whose fn returns normally tells its peers (mpi_comm::finish), so a
// peer still waiting in a collective that rank never called fails at once with a message that
// names it, and that failure aborts the job the same way.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "zshard/comm/mpi_comm.hpp"

namespace zshard {

// MPI_Init_thread on construction (unless MPI is already initialised), MPI_Finalize on
// destruction (only if it initialised MPI). Asks for MPI_THREAD_SERIALIZED: one thread at a
// time calls MPI, which is how each rank uses its communicator.
class mpi_session {
 public:
  mpi_session(int& argc, char**& argv) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) return;
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      throw error(error_kind::comm, "MPI_Init_thread failed", "start the program with mpirun/mpiexec or srun");
    owner_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw error(error_kind::comm,
                  "the MPI library provides thread level " + std::to_string(provided) + ", below MPI_THREAD_SERIALIZED",
                  "use an MPI built with thread support (Open MPI and MPICH are by default)");
    }
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (owner_ && !fin) MPI_Finalize();
  }

  static int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  static int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }

 private:
  bool owner_ = false;
};

// Prints this rank's failure once and ends the whole job. Never returns.
[[noreturn]] inline void abort_job(const std::string& what, int code = 1) noexcept {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  int rank = 0, size = 1;
  if (init && !fin) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  std::fprintf(stderr, "zshard: rank %d of %d failed: %s\n", rank, size, what.c_str());
  std::fflush(stderr);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// Runs fn(mpi_comm&) as this process's rank of MPI_COMM_WORLD and returns 0 once every rank
// has finished consistently (mpi_comm::finish). On any exception: abort_job (see above).
// The session outlives the catch: MPI_Finalize would wait for the failed job's other ranks.
template <class F>
int run_mpi(int& argc, char**& argv, F&& fn, mpi_options opts = {}) {
  std::optional<mpi_session> session;
  try {
    session.emplace(argc, argv);
    mpi_comm comm(MPI_COMM_WORLD, opts);
    std::forward<F>(fn)(comm);
    comm.finish();
  } catch (const std::exception& e) {
    abort_job(e.what());
  } catch (...) {
    abort_job("unknown exception");
  }
  return 0;
}

}  // namespace zshard

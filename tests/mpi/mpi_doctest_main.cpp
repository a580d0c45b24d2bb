// doctest main for tests run as MPI processes (mpiexec -n N test_mpi): every process runs every
// test case (they are collective), rank 0 reports in full, the others only their failures, and
// the exit status is the worst over all ranks, so ctest sees a failure on any rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include "zshard/comm/mpi_run.hpp"

int main(int argc, char** argv) {
  zshard::mpi_session session(argc, argv);
  doctest::Context ctx(argc, argv);
  if (zshard::mpi_session::world_rank() != 0) ctx.setOption("minimal", true);
  const int mine = ctx.run();
  int worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

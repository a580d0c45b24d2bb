// A small MPI job that fails on purpose, for tests/mpi/expect_failure.sh: the launcher's exit
// status, what is printed and how long the job takes to end are asserted from outside.
//   failure_driver <mode> [timeout_ms]
// mode: ok              every rank runs 10 collectives and ends (exit 0)
//       throw           rank 1 throws after 3 collectives; the others go on calling collectives
//       early_exit      rank 1 returns without error after 3 collectives
//       split_early_exit  as early_exit, in the groups of a 2 x 2 hybrid layout (the world split
//                       into pairs and across them, 4 ranks): the others wait for rank 1 in a group
//       hang            rank 1 sleeps (a hung rank) after 3 collectives; the others time out
//       model_mismatch  rank 1 registers a model with one more layer
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "../engine/toy_model.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/mpi_run.hpp"
#include "zshard/engine/engine.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int timeout_ms = argc > 2 ? std::stoi(argv[2]) : 60'000;
  zshard::mpi_options opts;
  opts.timeout = std::chrono::milliseconds(timeout_ms);
  return zshard::run_mpi(
      argc, argv,
      [&](zshard::mpi_comm& comm) {
        const int r = comm.rank();
        if (mode == "model_mismatch") {
          toy::config mc;
          if (r == 1) mc.layers += 1;
          toy::ids id;
          zshard::host_backend backend;
          zshard::engine<zshard::host_backend, zshard::mpi_comm> eng(backend, comm, toy::make_spec(mc, id), {});
          return;
        }
        if (mode == "split_early_exit") {
          zshard::mpi_comm pairs = comm.split(r / 2, r), across = comm.split(r % 2, r);
          for (int i = 0; i < 10; ++i) {
            if (r == 1 && i == 3) return;
            float x = float(r), sum = 0;
            pairs.all_reduce(&x, &sum, 1, zshard::dtype::f32, zshard::reduce_op::sum);
            across.all_reduce(&x, &sum, 1, zshard::dtype::f32, zshard::reduce_op::sum);
          }
          if (r == 0) std::printf("failure_driver: %s finished\n", mode.c_str());
          return;
        }
        for (int i = 0; i < 10; ++i) {
          if (r == 1 && i == 3) {
            if (mode == "throw") throw std::runtime_error("injected failure after 3 collectives");
            if (mode == "early_exit") return;
            if (mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(120));
          }
          float x = float(r), sum = 0;
          comm.all_reduce(&x, &sum, 1, zshard::dtype::f32, zshard::reduce_op::sum);
        }
        if (r == 0) std::printf("failure_driver: %s finished\n", mode.c_str());
      },
      opts);
}

#pragma once
// NCCL with one process per GPU, bootstrapped over MPI: the launch clusters use (mpirun or
// srun, one process per GPU, any number of nodes). Kept apart from nccl_comm.hpp so plain
// NCCL users (single-process multi-GPU) need no MPI.
//
//   zshard::run_mpi(argc, argv, [&](zshard::mpi_comm& host) {
//     zshard::nccl_comm nccl = zshard::make_nccl_comm(host);   // GPU = node-local rank
//     ...engine<cuda_backend, nccl_comm> on it...
//   });
//
// Rank 0 makes the NCCL unique id and broadcasts it through the MPI communicator (with its
// timeout, so a rank that never arrives fails instead of hanging); each process takes the GPU
// of its node-local rank, found with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), so the same
// command line works on one node or many.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <string>

#include "zshard/comm/mpi_comm.hpp"
#include "zshard/comm/nccl_comm.hpp"

namespace zshard {

// This process's rank among the processes of `comm` on the same node, and their number.
struct node_local {
  int rank = 0;
  int size = 1;
};
inline node_local node_local_rank(MPI_Comm comm) {
  MPI_Comm shared = MPI_COMM_NULL;
  const int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
  if (rc != MPI_SUCCESS)
    throw error(error_kind::comm, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed: " + mpi_detail::error_string(rc));
  node_local out;
  MPI_Comm_rank(shared, &out.rank);
  MPI_Comm_size(shared, &out.size);
  MPI_Comm_free(&shared);
  return out;
}

// The GPU this process should drive: its node-local rank, checked against the GPUs it sees.
inline int device_for_node_local_rank(MPI_Comm comm) {
  const node_local local = node_local_rank(comm);
  int devices = 0;
  cuda::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  ZSHARD_REQUIRE(local.size <= devices, error_kind::config,
                 std::to_string(local.size) + " processes share this node but it has " + std::to_string(devices) +
                     " visible GPU(s)",
                 "start one process per GPU (mpirun --map-by ppr:<gpus>:node, or srun --gpus-per-task=1)");
  return local.rank;
}

// One nccl_comm rank per MPI rank of `host`, on `device` (default: the node-local rank's GPU).
// A collective over host: every rank calls it.
inline nccl_comm make_nccl_comm(mpi_comm& host, nccl_options opts = {}, int device = -1) {
  if (device < 0) device = device_for_node_local_rank(host.handle());
  ncclUniqueId id{};
  if (host.rank() == 0) id = nccl_comm::make_unique_id();
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0, "the id travels as f32 words");
  host.broadcast(&id, sizeof id / sizeof(float), dtype::f32, 0);  // bytes, as f32 words: a copy
  return nccl_comm(id, host.size(), host.rank(), device, opts);
}

}  // namespace zshard

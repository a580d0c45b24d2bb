#pragma once
// The values that choose hybrid sharding (engine_config::hybrid): ranks form
// `replicas x shard_group`; parameters, gradients and optimizer state are sharded within a shard
// group and replicated across groups (FSDP's HSDP, DeepSpeed's MiCS). See partition/hybrid_layout.hpp.
namespace zshard {

struct hybrid_config {
  // Ranks per shard group; 0 (or the world size) is plain ZeRO-3 over the whole world. Groups are
  // contiguous blocks of world ranks: group k holds ranks [k * size, (k + 1) * size), which is
  // "one group per node" when a launcher places ranks node by node (mpirun, srun do).
  int shard_group_size = 0;
  // Ranks per node, for communicators that cannot tell which ranks share a node (NCCL, null):
  // node n holds ranks [n * ranks_per_node, (n + 1) * ranks_per_node). 0: ask the communicator
  // (threads: one node; MPI: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), or do not check.
  int ranks_per_node = 0;
};

}  // namespace zshard

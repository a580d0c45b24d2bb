#pragma once
// The 2-D layout of hybrid sharding: world rank w is rank (w mod G) of shard group (w / G), and
// replica (w / G) of the replica group of the ranks with the same index in their shard group. A
// Partitioner lays parameters out over a shard group (world = G); the same shard is held by the
// R = world / G ranks of one replica group, which all-reduce its gradient.
//
// Node rule (checked at construction where the launch says which ranks share a node): every
// shard group lies within one node or is made of whole nodes. A group that takes part of a node
// and part of another would send its per-module gathers across the network for a fraction of
// its ranks while wasting the fast links inside the node; it is always a launch mistake (a group
// size that does not match the ranks per node, or ranks placed round-robin across nodes).
#include <string>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/partition/hybrid_config.hpp"

namespace zshard {

struct hybrid_layout {
  int world = 1;
  int group_size = 1;  // G: ranks per shard group
  int replicas = 1;    // R = world / G

  bool flat() const noexcept { return replicas == 1; }  // plain ZeRO-3
  int group_of(int rank) const noexcept { return rank / group_size; }  // its replica index
  int rank_in_group(int rank) const noexcept { return rank % group_size; }

  // The layout `cfg` asks for in a world of `world` ranks; a clear error when it cannot be.
  static hybrid_layout of(const hybrid_config& cfg, int world) {
    ZSHARD_REQUIRE(world >= 1, error_kind::config, "world size must be at least 1, got " + std::to_string(world));
    ZSHARD_REQUIRE(cfg.shard_group_size >= 0, error_kind::config,
                   "hybrid.shard_group_size must be >= 0 (0: the whole world), got " +
                       std::to_string(cfg.shard_group_size));
    ZSHARD_REQUIRE(cfg.ranks_per_node >= 0, error_kind::config,
                   "hybrid.ranks_per_node must be >= 0 (0: ask the communicator), got " +
                       std::to_string(cfg.ranks_per_node));
    const int g = cfg.shard_group_size == 0 ? world : cfg.shard_group_size;
    ZSHARD_REQUIRE(g <= world && world % g == 0, error_kind::config,
                   "hybrid.shard_group_size = " + std::to_string(g) + " does not divide the world of " +
                       std::to_string(world) + " ranks into equal shard groups",
                   "choose a divisor of the world size (usually the ranks per node), or 0 for plain ZeRO-3");
    return {world, g, world / g};
  }

  // Node membership from a launch: node_of_rank[w] names rank w's node (any id; ranks with the
  // same id share a node). Throws error_kind::config naming the first group that breaks the rule.
  void check_nodes(const std::vector<int>& node_of_rank, const char* source) const {
    if (flat() || node_of_rank.empty()) return;
    ZSHARD_REQUIRE(static_cast<int>(node_of_rank.size()) == world, error_kind::config,
                   std::string(source) + " names the node of " + std::to_string(node_of_rank.size()) +
                       " ranks, the world has " + std::to_string(world));
    auto ranks_on = [&](int node) {
      int n = 0;
      for (int id : node_of_rank) n += id == node;
      return n;
    };
    for (int k = 0; k < replicas; ++k) {
      const int first = k * group_size;
      bool one_node = true, whole_nodes = true;
      for (int w = first; w < first + group_size; ++w) {
        one_node = one_node && node_of_rank[w] == node_of_rank[first];
        int in_group = 0;
        for (int v = first; v < first + group_size; ++v) in_group += node_of_rank[v] == node_of_rank[w];
        whole_nodes = whole_nodes && in_group == ranks_on(node_of_rank[w]);
      }
      ZSHARD_REQUIRE(one_node || whole_nodes, error_kind::config,
                     "shard group " + std::to_string(k) + " (ranks " + std::to_string(first) + ".." +
                         std::to_string(first + group_size - 1) + ") takes part of a node and part of another (" +
                         source + "): hybrid.shard_group_size = " + std::to_string(group_size) +
                         " does not fit the launch's nodes",
                     "make shard_group_size the ranks per node (or a divisor or multiple of it), and place ranks "
                     "node by node (mpirun --map-by ppr:<n>:node, srun --ntasks-per-node=<n>)");
    }
  }
  // Nodes as contiguous blocks of `ranks_per_node` ranks (hybrid_config::ranks_per_node).
  static std::vector<int> contiguous_nodes(int world, int ranks_per_node) {
    ZSHARD_REQUIRE(ranks_per_node > 0 && world % ranks_per_node == 0, error_kind::config,
                   "hybrid.ranks_per_node = " + std::to_string(ranks_per_node) + " does not divide the world of " +
                       std::to_string(world) + " ranks",
                   "give the number of ranks the launcher places on each node");
    std::vector<int> nodes(static_cast<std::size_t>(world));
    for (int w = 0; w < world; ++w) nodes[static_cast<std::size_t>(w)] = w / ranks_per_node;
    return nodes;
  }

  // Whether the ranks {first + k * stride : k < count} sit on more than one node.
  static bool spans_nodes(const std::vector<int>& node_of_rank, int first, int stride, int count) {
    for (int k = 1; k < count; ++k)
      if (node_of_rank[static_cast<std::size_t>(first + k * stride)] != node_of_rank[static_cast<std::size_t>(first)])
        return true;
    return false;
  }
};

}  // namespace zshard

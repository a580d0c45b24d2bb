#pragma once
// The communicators of hybrid sharding (partition/hybrid_layout.hpp), built with split() at
// engine construction: the shard group (gathers, the reduce-scatter of gradients, everything
// the Partitioner's layout is about) and the replica group (the all-reduce of each reduced
// gradient shard across the groups that hold the same shard). The world communicator stays the
// engine's for what every rank must agree on (settings, schedules, the step's gradient norm).
//
// In the flat layout (shard_group_size = world, the default) nothing is split and nothing is
// exchanged here: the shard group is the world communicator itself, so the engine's collectives
// are exactly plain ZeRO-3's.
//
// Before splitting, the ranks check over the world that they agree on the schedule-shaping
// settings, the layout included (the same exchange a flat engine makes after construction, with
// the same tag and length, so a rank configured flat and one configured hybrid meet in it and
// both fail naming hybrid.shard_group_size), then that the groups fit the launch's nodes.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/engine/rank_agreement.hpp"
#include "zshard/partition/hybrid_layout.hpp"

namespace zshard {

// Optional communicator capability: node_ids(), a collective returning, for every rank, an id
// shared by the ranks of one node (thread_comm: one node; mpi_comm: MPI_COMM_TYPE_SHARED).
template <class C>
concept knows_nodes = requires(C& c) {
  { c.node_ids() } -> std::same_as<std::vector<int>>;
};

template <class Backend, class Comm>
class hybrid_groups {
 public:
  // `reduce_world` is the engine's reduction communicator over the world (may be `world`).
  hybrid_groups(Backend& backend, Comm& world, Comm& reduce_world, const hybrid_layout& layout,
                const hybrid_config& cfg, const std::vector<setting_value>& settings)
      : world_(world), reduce_world_(reduce_world), layout_(layout), world_rank_(world.rank()) {
    if (layout.flat()) return;
    if constexpr (!splittable<Comm>) {
      throw error(error_kind::config,
                  "hybrid sharding (hybrid.shard_group_size = " + std::to_string(cfg.shard_group_size) +
                      ") needs split(color, key) on the engine's communicator type, and this type has none (zshard's "
                      "thread, MPI, NCCL and null communicators have it; a wrapper around one does not, unless it "
                      "forwards it)",
                  "give the communicator type `C split(int color, int key)` returning the same type (a wrapper: "
                  "wrap the inner communicator's split), or set hybrid.shard_group_size = 0 for plain ZeRO-3");
    } else {
      if constexpr (Backend::holds_storage) {
        auto stream = backend.make_stream();
        check_settings_on(backend, world, stream, comm_stream::of(stream), settings);
      }
      check_nodes(world, cfg);
      const int rank = world.rank();
      const int group = layout.group_of(rank), index = layout.rank_in_group(rank);
      const int g = layout.group_size;
      shard_.emplace(split_by(world, group, rank, [g](int w) { return std::pair{w / g, w}; }));
      if (&reduce_world != &world)
        reduce_shard_.emplace(split_by(reduce_world, group, rank, [g](int w) { return std::pair{w / g, w}; }));
      replica_.emplace(split_by(reduce_world, index, rank, [g](int w) { return std::pair{w % g, w}; }));
      ZSHARD_REQUIRE(shard_->size() == layout.group_size && replica_->size() == layout.replicas &&
                         shard_->rank() == index && replica_->rank() == group,
                     error_kind::invariant,
                     "split() made a shard group of " + std::to_string(shard_->size()) + " and a replica group of " +
                         std::to_string(replica_->size()) + " ranks for a " + std::to_string(layout.replicas) + " x " +
                         std::to_string(layout.group_size) + " layout");
    }
  }
  hybrid_groups(const hybrid_groups&) = delete;
  hybrid_groups& operator=(const hybrid_groups&) = delete;

  const hybrid_layout& layout() const noexcept { return layout_; }
  Comm& world() noexcept { return world_; }
  int world_rank() const noexcept { return world_rank_; }
  // Gathers and everything about shards: the world communicator when the layout is flat.
  Comm& shard() noexcept { return shard_ ? *shard_ : world_; }
  // Reduce-scatters inside the shard group, on the reduction communicator's split.
  Comm& reduce_shard() noexcept {
    if (reduce_shard_) return *reduce_shard_;
    return &reduce_world_ == &world_ ? shard() : reduce_world_;
  }
  // All-reduces of gradient shards across groups; null in the flat layout.
  Comm* replica() noexcept { return replica_ ? &*replica_ : nullptr; }

 private:
  template <class Rule>
  static Comm split_by(Comm& c, int color, int key, Rule rule) {
    if constexpr (requires(Comm& x) { x.set_split_rule(rule); }) {
      Comm copy = c;  // null_comm has no peers to ask: every simulated rank follows the layout's rule
      copy.set_split_rule(rule);
      return copy.split(color, key);
    } else {
      return c.split(color, key);
    }
  }

  // hybrid_config::ranks_per_node when given, else what the communicator knows of the launch.
  void check_nodes(Comm& world, const hybrid_config& cfg) {
    if (cfg.ranks_per_node > 0) {
      layout_.check_nodes(hybrid_layout::contiguous_nodes(layout_.world, cfg.ranks_per_node), "hybrid.ranks_per_node");
    } else if constexpr (knows_nodes<Comm>) {
      layout_.check_nodes(world.node_ids(), "the communicator's nodes");
    }
  }

  Comm& world_;
  Comm& reduce_world_;
  hybrid_layout layout_;
  int world_rank_;
  std::optional<Comm> shard_, reduce_shard_, replica_;
};

}  // namespace zshard

#pragma once
// The default Partitioner: every parameter split evenly across ranks, the last shard padded;
// parameters at or below the persistence threshold stay replicated.
#include "zshard/partition/partitioner.hpp"

namespace zshard::partition {

struct even {
  using zshard_tag = partitioner_tag;
  template <class Backend, class Comm>
  using impl = even;

  shard_layout layout(const param_identity& p, int world, const partition_config& cfg) const {
    ZSHARD_REQUIRE(world >= 1, error_kind::config, "world size must be at least 1");
    const std::size_t numel = p.numel();
    shard_layout l;
    l.numel = numel;
    if (numel <= cfg.persistence_threshold_numel) {
      l.replicated = true;
      l.shard_numel = l.padded_numel = numel;
      return l;
    }
    const auto w = static_cast<std::size_t>(world);
    const std::size_t align = cfg.shard_alignment_numel;
    const std::size_t per_rank = numel / w + (numel % w != 0 ? 1 : 0);
    l.shard_numel = checked_round_up(per_rank, align, "shard alignment");
    l.padded_numel = checked_mul(l.shard_numel, w, "padded parameter size");
    return l;
  }
};

static_assert(check_partitioner<even>());

}  // namespace zshard::partition

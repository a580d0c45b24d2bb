#pragma once
// The default Partitioner: every parameter split evenly across ranks, the last shard padded;
// parameters at or below the persistence threshold stay replicated.
#include "zshard/partition/partitioner.hpp"

namespace zshard::partition {

struct even {
  using zshard_tag = partitioner_tag;
  template <class Backend, class Comm>
  using impl = even;

  shard_layout layout(std::size_t numel, int world, const partition_config& cfg) const {
    ZSHARD_REQUIRE(world >= 1, error_kind::config, "world size must be at least 1");
    shard_layout l;
    l.numel = numel;
    if (numel <= cfg.persistence_threshold_numel) {
      l.replicated = true;
      l.shard_numel = l.padded_numel = numel;
      return l;
    }
    const auto w = static_cast<std::size_t>(world);
    const std::size_t align = cfg.shard_alignment_numel;
    const std::size_t per_rank = (numel + w - 1) / w;
    l.shard_numel = (per_rank + align - 1) / align * align;
    l.padded_numel = l.shard_numel * w;
    return l;
  }
};

static_assert(check_partitioner<even>());

}  // namespace zshard::partition

#pragma once
// Partitioner: maps each parameter to shards. Contract:
//  - layout(numel, world, cfg) is a pure function; every rank computes the same layout.
//  - A sharded parameter is padded to padded_numel = world * shard_numel >= numel; rank r holds
//    elements [r * shard_numel, (r + 1) * shard_numel) of the padded parameter (padding is
//    zero and never reaches the model). Collectives therefore always see equal per-rank counts.
//  - A replicated parameter has shard_numel == padded_numel == numel on every rank.
#include <concepts>
#include <cstddef>

#include "zshard/core/policy_tags.hpp"
#include "zshard/engine/engine_config.hpp"

namespace zshard {

struct shard_layout {
  std::size_t numel = 0;         // elements of the parameter
  std::size_t shard_numel = 0;   // elements each rank stores
  std::size_t padded_numel = 0;  // elements of the gathered (padded) parameter
  bool replicated = false;       // kept whole on every rank

  // The range of real (unpadded) elements rank r owns: [begin, end).
  std::size_t owned_begin(int rank) const noexcept {
    const std::size_t b = replicated ? 0 : static_cast<std::size_t>(rank) * shard_numel;
    return b < numel ? b : numel;
  }
  std::size_t owned_end(int rank) const noexcept {
    const std::size_t e = replicated ? numel : owned_begin(rank) + shard_numel;
    return e < numel ? e : numel;
  }
};

template <class P>
concept partitioner = opts_into<P, partitioner_tag> &&
                      requires(const P& p, std::size_t numel, int world, const partition_config& cfg) {
                        { p.layout(numel, world, cfg) } -> std::same_as<shard_layout>;
                      };

template <class P>
constexpr bool check_partitioner() {
  static_assert(opts_into<P, partitioner_tag>,
                "zshard: a Partitioner declares `using zshard_tag = zshard::partitioner_tag;`");
  static_assert(partitioner<P>,
                "zshard: a Partitioner provides `shard_layout layout(std::size_t numel, int world, "
                "const partition_config&) const`");
  return true;
}

}  // namespace zshard

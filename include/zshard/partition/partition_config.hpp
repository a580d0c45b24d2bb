#pragma once
// The values that tune a Partitioner (engine_config::partition).
#include <cstddef>

namespace zshard {

struct partition_config {
  // Parameters with at most this many elements stay replicated on every rank (no gather, an
  // all-reduce instead of a reduce-scatter): biases and norm gains cost more to gather than to keep.
  std::size_t persistence_threshold_numel = 0;
  // Each rank's shard is padded to a multiple of this many elements (vector-friendly shards).
  std::size_t shard_alignment_numel = 1;
};

}  // namespace zshard

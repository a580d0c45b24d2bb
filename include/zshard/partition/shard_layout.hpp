#pragma once
// Where a parameter's elements live across ranks: what a Partitioner decides for each parameter.
#include <cstddef>

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

}  // namespace zshard

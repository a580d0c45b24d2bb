#pragma once
// Moving n elements from a source to a destination through one bounded host chunk, converting
// the element type on the way (round to nearest even): the inner loop of every load, save and
// export. read(first, k, dst) fills k elements of the source type, write(first, k, src) takes
// k elements of the destination type; first counts from 0.
#include <algorithm>
#include <cstdint>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

// The chunk bytes that hold n elements in every array a copy lays out in its chunk (`per`: their
// bytes per element together), each array rounded up to 16 elements as the copies align them: a
// copy never uses more, so a chunk of this size for the largest piece, where that is below the
// caller's limit, does the same work in less memory.
constexpr std::uint64_t chunk_bytes_for_arrays(std::uint64_t n, std::uint64_t per) noexcept {
  return (n + 15) / 16 * 16 * per;
}
// chunked_copy's: the elements as read, and converted when the types differ.
constexpr std::uint64_t chunk_bytes_for(std::uint64_t n, dtype from, dtype to) noexcept {
  return chunk_bytes_for_arrays(n, from == to ? size_of(from) : size_of(from) + size_of(to));
}

template <class Read, class Write>
void chunked_copy(char* chunk, std::size_t chunk_bytes, std::uint64_t n, dtype from, dtype to, Read&& read,
                  Write&& write) {
  const bool same = from == to;
  const std::size_t per = same ? size_of(from) : size_of(from) + size_of(to);
  const std::size_t k_max = chunk_bytes / per / 16 * 16;  // the converted half stays aligned
  ZSHARD_REQUIRE(k_max > 0, error_kind::config, "checkpoint chunk of " + std::to_string(chunk_bytes) + " bytes is too small",
                 "use a chunk of at least a few KiB (e.g. 64 MiB)");
  char* converted = chunk + k_max * size_of(from);
  for (std::uint64_t first = 0; first < n;) {
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(k_max, n - first));
    read(first, k, static_cast<void*>(chunk));
    if (same) {
      write(first, k, static_cast<const void*>(chunk));
    } else {
      convert(chunk, from, converted, to, k);
      write(first, k, static_cast<const void*>(converted));
    }
    first += k;
  }
}

}  // namespace zshard::checkpoint

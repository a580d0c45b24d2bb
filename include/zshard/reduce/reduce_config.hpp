#pragma once
// The values that tune a Reducer (engine_config::reduce).
#include <cstddef>

namespace zshard {

struct reduce_config {
  std::size_t reduce_bucket_numel = 500'000'000;  // full gradients held before a reduce-scatter flush
  // Replicated gradients (biases, norm gains) of at most this many elements are packed, in
  // flush order, into all-reduces of at most this many elements: one collective for many small
  // tensors. The pack is staged (grad_buckets), so this also bounds the only memory the Reducer
  // holds beyond its bucket (I6). 0: every replicated gradient all-reduced alone, in place.
  std::size_t replicated_pack_numel = std::size_t{1} << 18;
};

}  // namespace zshard

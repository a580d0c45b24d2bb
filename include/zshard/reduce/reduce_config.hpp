#pragma once
// The values that tune a Reducer (engine_config::reduce).
#include <cstddef>

namespace zshard {

struct reduce_config {
  std::size_t reduce_bucket_numel = 500'000'000;  // full gradients held before a reduce-scatter flush
};

}  // namespace zshard

#pragma once
// Every size, budget and hyper-parameter of an engine, in one aggregate. Policy *types* select
// behaviour; these *values* tune it. Defaults are spelled here and nowhere else.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/offload/offload_config.hpp"
#include "zshard/optim/loss_scaler.hpp"

namespace zshard {

struct partition_config {
  // Parameters with at most this many elements stay replicated on every rank (no gather, an
  // all-reduce instead of a reduce-scatter): biases and norm gains cost more to gather than to keep.
  std::size_t persistence_threshold_numel = 0;
  // Each rank's shard is padded to a multiple of this many elements (vector-friendly shards).
  std::size_t shard_alignment_numel = 1;
};

struct prefetch_config {
  std::size_t max_live_numel = 1'000'000'000;  // resident gathered elements, hard budget (I5)
  std::size_t prefetch_numel = 50'000'000;     // how far ahead of use to gather
  std::size_t max_reuse_distance = 0;          // keep a parameter if it is used again within this many elements
  // A single module larger than max_live_numel is a configuration error unless this is set,
  // in which case that module alone may exceed the budget while it executes.
  bool allow_oversized_module = false;
};

struct reduce_config {
  std::size_t reduce_bucket_numel = 500'000'000;  // full gradients held before a reduce-scatter flush
};

struct engine_config {
  dtype param_dtype = dtype::f32;  // working dtype of parameters that do not name their own
  partition_config partition{};
  prefetch_config prefetch{};
  reduce_config reduce{};
  optim::adamw_config adamw{};
  double clip_norm = 0.0;  // global-norm gradient clipping; 0 turns it off
  optim::loss_scale_config loss_scale{};
  offload_config offload{};  // host Offloader: threads, SIMD path, tiles, host memory budget
  // Gathers and gradient reductions on streams of their own, overlapping compute, when the
  // backend has role streams (CUDA; with NCCL, create the communicator with
  // nccl_completion::enqueue, or each collective blocks the host until done). Off: one stream.
  bool overlap = true;
  // Where the engine and its policies say things worth a human's attention (a prefetch trace
  // divergence, swept uses). Empty: standard error, prefixed "zshard: ".
  std::function<void(const std::string&)> log{};

  void say(const std::string& line) const {
    if (log)
      log(line);
    else
      std::cerr << "zshard: " << line << '\n';
  }

  void validate() const {
    ZSHARD_REQUIRE(partition.shard_alignment_numel > 0, error_kind::config, "shard_alignment_numel must be at least 1");
    ZSHARD_REQUIRE(prefetch.max_live_numel > 0, error_kind::config, "max_live_numel must be positive");
    ZSHARD_REQUIRE(reduce.reduce_bucket_numel > 0, error_kind::config, "reduce_bucket_numel must be positive");
    ZSHARD_REQUIRE(clip_norm >= 0.0, error_kind::config, "clip_norm must be >= 0 (0 turns clipping off)");
    adamw.validate();
    loss_scale.validate();
    offload.validate();
  }
};

}  // namespace zshard

#pragma once
// Every size, budget and hyper-parameter of an engine, in one aggregate of the policies' own
// configs (each beside its policy) and the engine's settings. Policy *types* select behaviour;
// these *values* tune it. Defaults are spelled in those headers and nowhere else.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/log.hpp"
#include "zshard/offload/offload_config.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/grad_clip.hpp"
#include "zshard/optim/loss_scaler.hpp"
#include "zshard/optim/param_groups.hpp"
#include "zshard/partition/hybrid_config.hpp"
#include "zshard/partition/partition_config.hpp"
#include "zshard/prefetch/prefetch_config.hpp"
#include "zshard/reduce/reduce_config.hpp"

namespace zshard {

class trace_sink;  // trace/trace_sink.hpp

struct engine_config {
  dtype param_dtype = dtype::f32;  // working dtype of parameters that do not name their own
  partition_config partition{};
  // Hybrid sharding (partition/hybrid_config.hpp): shard within groups of ranks, replicate across
  // them. The default is plain ZeRO-3 over the whole world.
  hybrid_config hybrid{};
  prefetch_config prefetch{};
  reduce_config reduce{};
  optim::adamw_config adamw{};
  double clip_norm = 0.0;  // global-norm gradient clipping; 0 turns it off
  double clip_norm_type = 2.0;  // the norm clipped and reported: 2, 1 or INFINITY (as clip_grad_norm_)
  // Learning rate and weight decay per group of parameters (optim/param_groups.hpp); parameters
  // no group claims are in group "default", with adamw's values.
  std::vector<optim::param_group> param_groups{};
  optim::loss_scale_config loss_scale{};
  offload_config offload{};  // host Offloader: threads, SIMD path, tiles, host memory budget
  // Gathers and gradient reductions on streams of their own, overlapping compute, when the
  // backend has role streams (CUDA; with NCCL, create the communicator with
  // nccl_completion::enqueue, or each collective blocks the host until done). Off: one stream.
  bool overlap = true;
  // Ranks that run different schedules (different modules, order or routing) are always caught
  // before the optimizer applies anything: each collective carries its identity where the
  // communicator takes tags (threads; see communicator.hpp), and the schedule fingerprints are
  // compared at every step(). Set this to also compare them at every scope, before its gathers:
  // one small all_gather per scope, for communicators that cannot carry tags (NCCL) when a
  // divergence must be caught where it happens rather than at the step.
  bool check_every_scope = false;
  // Where the engine and its policies say things worth a human's attention (a prefetch trace
  // divergence, swept uses). Empty: standard error, prefixed "zshard: ".
  log_sink log{};
  // An opt-in trace of engine events and ledger counters on every rank, as Chrome/Perfetto JSON
  // (trace/trace_sink.hpp). Not owned; it must outlive the engines. Null: no trace, no cost.
  trace_sink* trace = nullptr;

  void say(const std::string& line) const { zshard::say(log, line); }

  void validate() const {
    ZSHARD_REQUIRE(partition.shard_alignment_numel > 0, error_kind::config, "shard_alignment_numel must be at least 1");
    ZSHARD_REQUIRE(hybrid.shard_group_size >= 0 && hybrid.ranks_per_node >= 0, error_kind::config,
                   "hybrid.shard_group_size and hybrid.ranks_per_node must be >= 0 (0: the default)");
    ZSHARD_REQUIRE(prefetch.max_live_numel > 0, error_kind::config, "max_live_numel must be positive");
    ZSHARD_REQUIRE(reduce.reduce_bucket_numel > 0, error_kind::config, "reduce_bucket_numel must be positive");
    ZSHARD_REQUIRE(clip_norm >= 0.0, error_kind::config, "clip_norm must be >= 0 (0 turns clipping off)");
    ZSHARD_REQUIRE(optim::is_supported_norm_type(clip_norm_type), error_kind::config,
                   "clip_norm_type = " + std::to_string(clip_norm_type) + " is not supported",
                   "use 2 (L2, the default), 1 or INFINITY (max-abs)");
    adamw.validate();
    loss_scale.validate();
    offload.validate();
  }
};

}  // namespace zshard

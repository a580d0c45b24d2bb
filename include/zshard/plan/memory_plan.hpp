#pragma once
// The memory planner: each rank's peak memory by ledger category, computed before anything
// runs from the model, the engine config, the world size, where the optimizer state lives and
// the training schedule (plan/schedule.hpp: what the loop asks of the engine, call by call,
// with the activation bytes it reports). The result reads like the ledger of a real run: a
// peak per category, the total peak, the categories at that moment and where it happened
// (plan/plan_result.hpp); for a GPU also the terms the ledger does not see
// (plan/device_overheads.hpp), which `fits` includes. Under the even partitioner every rank is
// the same, so one walk is every rank.
//
// It is an upper bound by construction: every category of the run's ledger peaks at or below
// the plan's, and so does the total, whatever order the engine admits gathers ahead in and
// whatever it evicts (the proof is in plan/gathered_bound.hpp). Every term except gathered
// parameters is replayed exactly; gathered parameters are exact unless max_live_numel stops
// gathers ahead, where the plan assumes the room left is filled with the widest parameters
// that could be there. Which Prefetcher the run uses, the plan must be told
// (plan_options::prefetcher; plan/policy_options.hpp says which plan holds for which policies
// and derives the options from a policies type). What the run calls beside its schedule the
// plan must be told too: keep-gathered modules, no-sync accumulation, and which parameters
// frozen at registration it unfreezes (by default: any of them; plan/trainable_stages.hpp walks
// the schedule once per trainable set and keeps the larger figure of each category).
//
// The terms, per rank (shard = ceil(numel / world) rounded up to
// partition.shard_alignment_numel, padded = shard · world, e = bytes of the working dtype; with
// hybrid sharding (engine_config::hybrid) `world` here is the shard group's size, except in the
// ranks' exchanges, which span every rank):
//  - sharded_params   Σ shard·e over all parameters (the whole value for replicated ones).
//  - optimizer_state  on device (offload::on_device): 3 · 4 · Σ shard of the parameters with
//                     state (f32 master, m, v): trainable at registration or unfrozen later
//                     (plan_options::unfreeze_stages); host_adam: 0 here, see the host ledger.
//  - grad_shards      on device: 4 · Σ shard of the same (f32, accumulated over micro-batches);
//                     host: 0 here.
//  - gathered_params  parameters of open scopes and those the HookTracker holds (a recomputed
//                     module until its backward), padded·e each (replicated ones are never
//                     gathered); with the trace Prefetcher (the default) also what it gathers
//                     ahead within prefetch_numel and keeps for reuse within
//                     max_reuse_distance, bounded by max_live_numel (I5) as above (with any
//                     other Prefetcher, max_live_numel filled with the widest parameters). The first
//                     step records the trace and prefetches nothing; a step that leaves the
//                     trace drops to on-demand; the walk follows the Prefetcher through as
//                     many steps as it takes for its state to repeat.
//  - grad_buckets     f32 full gradients, padded·4, allocated for the trainable parameters of
//                     a module when its backward scope opens, unless already there (a shared
//                     parameter, a module used several times: the gradient waits for the
//                     backward of its last counted use), and freed as the Reducer
//                     reduce-scatters them: a gradient that would overflow
//                     reduce_bucket_numel flushes the bucket first, a full bucket flushes at
//                     once, end_backward flushes the rest. A flush first packs replicated
//                     gradients of at most reduce.replicated_pack_numel elements into staging
//                     packs of at most that many (charged here, each gradient freed as copied)
//                     for one all-reduce per pack.
//  - scratch          the reduce-scatter's output, shard·4, while one parameter is reduced
//                     (replicated ones are all-reduced in place); gather_param() stages the
//                     padded value as f32 beside the gathered one (padded·(4 + e)), an export
//                     does so for each parameter in turn; construction on a backend with
//                     storage stages each shard's initial values as f32 and checks the model
//                     across ranks; the ranks' checks hold 8 · words · (1 + world): step() 4
//                     words, check_every_scope 2 per scope, and the control calls the options
//                     imply (set_gradient_sync 2, set_trainable / set_keep_gathered_until_backward
//                     3) wherever the engine allows them.
//  - activations      whatever the schedule reports (eng.report_activations).
//  The plan also counts each rank's bytes sent per step, inside its shard group and across
//  groups (memory_plan::traffic, plan_result.hpp).
//  Host ledger (optimizer on the host, offload::host_adam): optimizer_state 3 · 4 · Σ s and
//  grad_shards 4 · Σ s, s = shard rounded up to the host AdamW's tile granule, plus two
//  staging halves of host_staging_numel f32 when the backend's memory is a device's.
//  Offload tiers (engine_config::offload, docs/DESIGN.md; plan/offload_terms.hpp): with
//  parameters offloaded (params = host) a sharded parameter's shard·e moves from the device's
//  sharded_params to the host's, and each gather group charges its shards' upload buffers as
//  device scratch beside its gathered values (gather_param too); with the optimizer state on
//  NVMe the host keeps buffer_count chunk buffers (12 · nvme_chunk_numel bytes each) instead of
//  master, m and v, and the nvme ledger the files (two slots of ceil(Σ s / chunk) chunks).
//  memory_plan::moved counts a step's bytes to the device (uploads, working values through
//  staging), to the host (gradient shards) and to and from disk.
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/even_partitioner.hpp"
#include "zshard/partition/hybrid_layout.hpp"
#include "zshard/plan/plan_result.hpp"
#include "zshard/plan/plan_walk.hpp"
#include "zshard/plan/schedule.hpp"
#include "zshard/plan/step_schedule.hpp"
#include "zshard/plan/trainable_stages.hpp"

namespace zshard::plan {

// The plan for every step of `schedule` on each rank of a world of `world` ranks under
// Partitioner's layout.
template <class Partitioner = partition::even>
memory_plan plan_memory(const model_spec& spec, const engine_config& cfg, int world, const training_schedule& schedule,
                        const plan_options& opt = {}) {
  ZSHARD_REQUIRE(world >= 1, error_kind::config, "world size must be at least 1, got " + std::to_string(world));
  spec.validate();
  cfg.validate();
  schedule.validate(spec);
  const Partitioner partitioner{};
  // Hybrid sharding: parameters are laid out over a shard group; the ranks' checks span the world.
  const int group = hybrid_layout::of(cfg.hybrid, world).group_size;
  std::vector<shard_layout> layouts;
  layouts.reserve(spec.params().size());
  for (param_id p = 0; p < spec.params().size(); ++p) {
    const auto id = param_identity::of(spec, p, cfg.param_dtype);
    layouts.push_back(partitioner.layout(id, group, cfg.partition));
    validate_layout(layouts.back(), id, group);
  }
  plan_options o = opt;
  // Hybrid sharding splits two more communicators (shard group, replica group) off the world.
  if (group != world && o.overheads.communicators > 0) o.overheads.communicators += 2;
  return detail::plan_each_trainable_set(spec, o, [&](std::vector<bool> trainable, std::vector<bool> has_state) {
    return detail::plan_walk(spec, cfg, world, layouts, schedule, o, std::move(trainable), std::move(has_state)).run();
  });
}

// One step program, every step the same.
template <class Partitioner = partition::even>
memory_plan plan_memory(const model_spec& spec, const engine_config& cfg, int world, const step_program& step,
                        const plan_options& opt = {}) {
  return plan_memory<Partitioner>(spec, cfg, world, training_schedule{{step}}, opt);
}

// A sequential model's step (plan/step_schedule.hpp).
template <class Partitioner = partition::even>
memory_plan plan_memory(const model_spec& spec, const engine_config& cfg, int world, const step_schedule& schedule,
                        const plan_options& opt = {}) {
  schedule.validate(spec);
  return plan_memory<Partitioner>(spec, cfg, world, to_program(schedule), opt);
}

}  // namespace zshard::plan

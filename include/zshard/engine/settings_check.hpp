#pragma once
// Everything that shapes the schedule of collectives, as named values that every rank must
// share: ranks that differ in any of them would issue different gathers or reductions (or the
// same ones at different times), so the engine compares them across ranks at construction and
// names the first that differs (engine/rank_agreement.hpp), each printed as its own kind of value
// (setting_kind: a double as a number, a dtype by name, a flag as true/false, a hash in hex).
#include <bit>
#include <cstdint>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/engine/rank_agreement.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/optim/param_groups.hpp"
#include "zshard/partition/shard_layout.hpp"

namespace zshard {

// Parameter groups (optim/param_groups.hpp) do not shape the schedule, but ranks that disagree on
// them would apply different updates to the shards of one parameter: compared here as well.
inline std::vector<setting_value> schedule_settings(const model_spec& spec, const engine_config& cfg,
                                                    const std::vector<shard_layout>& layouts, int world) {
  const optim::param_groups groups(spec, cfg.param_groups, cfg.adamw);
  std::uint64_t layout_hash = 0xcbf29ce484222325ull;
  for (const auto& l : layouts)
    for (std::uint64_t v : {std::uint64_t(l.numel), std::uint64_t(l.shard_numel), std::uint64_t(l.padded_numel),
                            std::uint64_t(l.replicated)})
      layout_hash = (layout_hash ^ v) * 0x100000001b3ull;
  return {
      {"the world size", std::uint64_t(world)},
      {"hybrid.shard_group_size (ranks per shard group)",
       std::uint64_t(cfg.hybrid.shard_group_size == 0 ? world : cfg.hybrid.shard_group_size)},
      {"hybrid.ranks_per_node", std::uint64_t(cfg.hybrid.ranks_per_node)},
      {"the model (" + spec.label() + " on this rank: names, shapes, dtypes, flags, modules)", spec.fingerprint(), setting_kind::hash},
      {"param_dtype", std::uint64_t(cfg.param_dtype), setting_kind::type},
      {"partition.persistence_threshold_numel", cfg.partition.persistence_threshold_numel},
      {"partition.shard_alignment_numel", cfg.partition.shard_alignment_numel},
      {"the Partitioner's layouts", layout_hash, setting_kind::hash},
      {"prefetch.max_live_numel", cfg.prefetch.max_live_numel},
      {"prefetch.prefetch_numel", cfg.prefetch.prefetch_numel},
      {"prefetch.max_reuse_distance", cfg.prefetch.max_reuse_distance},
      {"prefetch.allow_oversized_module", std::uint64_t(cfg.prefetch.allow_oversized_module), setting_kind::flag},
      {"reduce.reduce_bucket_numel", cfg.reduce.reduce_bucket_numel},
      {"clip_norm", std::bit_cast<std::uint64_t>(cfg.clip_norm), setting_kind::real},
      {"clip_norm_type", std::bit_cast<std::uint64_t>(cfg.clip_norm_type), setting_kind::real},
      {"param_groups (names and members)", groups.members_hash(), setting_kind::hash},
      {"param_groups (learning rates)", groups.lr_hash(), setting_kind::hash},
      {"param_groups (weight decays)", groups.weight_decay_hash(), setting_kind::hash},
      {"check_every_scope", std::uint64_t(cfg.check_every_scope), setting_kind::flag},
      {"adamw.update_params_without_grad", std::uint64_t(cfg.adamw.update_params_without_grad), setting_kind::flag},
  };
}

}  // namespace zshard

#pragma once
// The engine's checks of its inputs and of its own state that need no engine member: ids in
// range, layouts from the Partitioner (validated), modules within the live budget, and I7 at
// end_backward (no full gradient left, so a HookTracker that forgets a parameter is an error,
// not a skipped update).
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/model/use_kind.hpp"
#include "zshard/partition/partitioner.hpp"
#include "zshard/state/param_store.hpp"

namespace zshard::engine_checks {

// Ids in range and of this engine's model (a bound id of another model_spec is a usage error
// naming both specs; see model/spec_id.hpp).
inline void module_id_in_range(const model_spec& spec, module_id m, const char* where = "engine scope") {
  (void)spec.check(m, where);
}

inline void param_id_in_range(const model_spec& spec, param_id p, const char* where) { (void)spec.check(p, where); }

inline std::string scope_name(const model_spec& spec, module_id m, use_kind kind, bool backward) {
  return (backward ? std::string("backward") : "forward (" + std::string(to_string(kind)) + ")") + " of module '" +
         spec.module(m).name + "'";
}

template <class Partitioner>
std::vector<shard_layout> make_layouts(const Partitioner& partitioner, const model_spec& spec, const engine_config& cfg,
                                       int world) {
  std::vector<shard_layout> l;
  l.reserve(spec.params().size());
  for (param_id p = 0; p < spec.params().size(); ++p) {
    const auto id = param_identity::of(spec, p, cfg.param_dtype);
    l.push_back(partitioner.layout(id, world, cfg.partition));
    validate_layout(l.back(), id, world);
  }
  return l;
}

template <class Residency>
void module_sizes(const model_spec& spec, const Residency& residency, const engine_config& cfg) {
  for (module_id m = 0; m < spec.modules().size(); ++m) {
    const std::size_t n = residency.module_gathered_numel(m);
    ZSHARD_REQUIRE(n <= cfg.prefetch.max_live_numel || cfg.prefetch.allow_oversized_module, error_kind::config,
                   "module '" + spec.module(m).name + "' needs " + std::to_string(n) +
                       " gathered elements, more than max_live_numel = " + std::to_string(cfg.prefetch.max_live_numel),
                   "raise max_live_numel, split the module, or set allow_oversized_module");
  }
}

// `held(p)`: p's full gradient is held on purpose (no-sync accumulation, engine/grad_sync.hpp).
template <class Backend, class Held>
void no_full_gradient_left(const param_store<Backend>& store, Held&& held) {
  for (param_id p = 0; p < store.size(); ++p)
    ZSHARD_REQUIRE(!store[p].full_grad || held(p), error_kind::invariant,
                   "parameter '" + store[p].spec->name +
                       "' still holds a full gradient after end_backward: the HookTracker never reported it complete, "
                       "so it would never be reduced or applied (I7)",
                   "the HookTracker must list every trainable parameter of a module in `completed` when its last "
                   "counted use's backward is done, and every pending one at on_end_backward");
}

// Parameter offload (offload_config::params): the Offloader attached the tier that keeps the
// shards the store left off the device (state/shard_tier.hpp).
template <class Backend>
void shard_tier_attached(const param_store<Backend>& store) {
  ZSHARD_REQUIRE(!store.offloads_shards() || store.has_tier(), error_kind::config,
                 "offload_config.params = host, but this engine's Offloader keeps no parameter shards",
                 "use offload::host_adam, which keeps them in host memory (offload/param_tier.hpp)");
}

}  // namespace zshard::engine_checks

#pragma once
// Prefetcher: decides what to gather ahead of use and what to keep gathered after a scope.
// Contract:
//   reset(spec, layouts, cfg)            once, binding it to a model, its shard layouts and the
//                                        engine config (budgets in cfg.prefetch, cfg.say() to log)
//   on_scope_enter(m, kind, ahead)       appends parameters to gather ahead of their use (beyond
//                                        m's own, which the engine gathers anyway). The engine
//                                        gathers them, in order, only while resident elements stay
//                                        within max_live_numel (I5); they are evicted first when a
//                                        scope needs the room.
//   keep_after_scope(p) -> bool          whether p stays gathered once no open scope uses it
//                                        (advisory: the engine may evict it to make room)
//   on_step()                            step boundary: the engine releases everything
//                                        non-persistent right after (I4)
#include <concepts>
#include <vector>

#include "zshard/core/policy_tags.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/partitioner.hpp"
#include "zshard/track/hook_tracker.hpp"

namespace zshard {

template <class P>
concept prefetcher = opts_into<P, prefetcher_tag> &&
                     requires(P& p, const model_spec& spec, const std::vector<shard_layout>& layouts,
                              const engine_config& cfg, module_id m, use_kind k, std::vector<param_id>& ahead,
                              param_id q) {
                       p.reset(spec, layouts, cfg);
                       p.on_scope_enter(m, k, ahead);
                       { p.keep_after_scope(q) } -> std::same_as<bool>;
                       p.on_step();
                     };

template <class P>
constexpr bool check_prefetcher() {
  static_assert(opts_into<P, prefetcher_tag>,
                "zshard: a Prefetcher declares `using zshard_tag = zshard::prefetcher_tag;`");
  static_assert(prefetcher<P>, "zshard: the type does not provide the Prefetcher contract; see prefetch/prefetcher.hpp");
  return true;
}

}  // namespace zshard

#pragma once
// Prefetcher: decides what to gather ahead of use and what to keep gathered after a scope.
// A family (core/policy_family.hpp) whose implementation provides:
//   reset(spec, layouts, cfg, log)       once, binding it to a model, its shard layouts, its
//                                        budgets (prefetch_config) and where to say things
//   on_scope_enter(m, kind, ahead)       appends parameters to gather ahead of their use (beyond
//                                        m's own, which the engine gathers anyway). The engine
//                                        gathers them, in order, only while resident elements stay
//                                        within max_live_numel (I5); they are evicted first when a
//                                        scope needs the room.
//   keep_after_scope(p) -> bool          whether p stays gathered once no open scope uses it
//                                        (advisory: the engine may evict it to make room)
//   on_step()                            step boundary: the engine releases everything
//                                        non-persistent right after (I4)
//   on_scope_failed(m, kind)             optional: the scope just entered could not be opened
//                                        (live budget, allocation); forget it, so a retry is
//                                        seen once
// The memory planner replays prefetch::trace and prefetch::on_demand; a plan for any other
// Prefetcher assumes only the live budget the engine enforces (plan/policy_options.hpp).
#include <concepts>
#include <vector>

#include "zshard/core/log.hpp"
#include "zshard/core/policy_family.hpp"
#include "zshard/core/policy_tags.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/model/use_kind.hpp"
#include "zshard/partition/shard_layout.hpp"
#include "zshard/prefetch/prefetch_config.hpp"

namespace zshard {

template <class P>
concept prefetcher = requires(P& p, const model_spec& spec, const std::vector<shard_layout>& layouts,
                              const prefetch_config& cfg, const log_sink& log, module_id m, use_kind k,
                              std::vector<param_id>& ahead, param_id q) {
  p.reset(spec, layouts, cfg, log);
  p.on_scope_enter(m, k, ahead);
  { p.keep_after_scope(q) } -> std::same_as<bool>;
  p.on_step();
};

// A policy family that opted in (a structural match alone never counts) and whose
// implementation conforms.
template <class F, class B = any_backend, class C = any_comm>
concept prefetcher_family = opts_into<F, prefetcher_tag> && has_policy_impl<F, B, C> && prefetcher<policy_impl_t<F, B, C>>;

// `static_assert(check_prefetcher<my_prefetcher>());` next to a Prefetcher's definition.
template <class Family, class Backend = any_backend, class Comm = any_comm>
constexpr bool check_prefetcher() {
  ZSHARD_CHECK_POLICY_FAMILY(Family, Backend, Comm, prefetcher_tag, "a Prefetcher", "Prefetcher");
  constexpr bool named = policy_named<Family, prefetcher_tag, Backend, Comm>;
  static_assert(!named || prefetcher<policy_impl_t<Family, Backend, Comm>>,
                "zshard: a Prefetcher provides reset(const model_spec&, const std::vector<shard_layout>&, "
                "const prefetch_config&, const log_sink&), on_scope_enter(module_id, use_kind, "
                "std::vector<param_id>&), bool keep_after_scope(param_id) and on_step(); see prefetch/prefetcher.hpp");
  return true;
}

}  // namespace zshard

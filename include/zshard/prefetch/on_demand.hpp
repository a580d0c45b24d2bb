#pragma once
// The on-demand Prefetcher: gathers a module's parameters when its scope opens and releases
// them when the last scope using them closes. Lowest memory, no overlap.
#include "zshard/prefetch/prefetcher.hpp"

namespace zshard::prefetch {

struct on_demand {
  using zshard_tag = prefetcher_tag;
  template <class Backend, class Comm>
  using impl = on_demand;

  void reset(const model_spec&, const std::vector<shard_layout>&, const prefetch_config&, const log_sink&) {}
  void on_scope_enter(module_id, use_kind, std::vector<param_id>&) {}
  bool keep_after_scope(param_id) const { return false; }
  void on_step() {}
};

static_assert(check_prefetcher<on_demand>());

}  // namespace zshard::prefetch

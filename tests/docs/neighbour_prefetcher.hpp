#pragma once
// docs/POLICIES.md's example Prefetcher (quoted from here), run by test_policies_doc and by the
// planner's property test (tests/plan/random_models.hpp) as a Prefetcher the planner does not mirror.
#include <vector>

#include "zshard/prefetch/prefetcher.hpp"

namespace mine {
using namespace zshard;

// ---- Prefetcher ----------------------------------------------------------------------------
// Gathers the neighbouring module in the direction of travel: m+1 going forward (ids rising),
// m-1 going backward. No trace, no state beyond the last module seen.
struct neighbour {
  using zshard_tag = prefetcher_tag;
  template <class Backend, class Comm>
  using impl = neighbour;

  void reset(const model_spec& spec, const std::vector<shard_layout>&, const prefetch_config&, const log_sink&) {
    spec_ = &spec;
    last_ = 0;
  }
  void on_scope_enter(module_id m, use_kind, std::vector<param_id>& ahead) {
    const bool rising = m >= last_;
    last_ = m;
    if (rising && m + 1 < spec_->modules().size())
      for (param_id p : spec_->module(m + 1).params) ahead.push_back(p);
    if (!rising && m > 0)
      for (param_id p : spec_->module(m - 1).params) ahead.push_back(p);
  }
  bool keep_after_scope(param_id) const { return false; }
  void on_step() { last_ = 0; }

 private:
  const model_spec* spec_ = nullptr;
  module_id last_ = 0;
};
static_assert(check_prefetcher<neighbour>());

}  // namespace mine

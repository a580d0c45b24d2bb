#pragma once
// The trainable sets a run goes through when it unfreezes parameters (plan_options::
// unfreeze_stages), and the plan of the run from one walk per set: each category's peak is the
// largest of the walks', the total's too, with its moment and place from the walk it came from.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/plan_result.hpp"

namespace zshard::plan::detail {

struct trainable_sets {
  std::vector<std::vector<bool>> sets;  // as registered, then after each stage of unfreezing
  std::vector<bool> has_state;          // parameters whose optimizer state exists at some point
};

inline trainable_sets resolve_trainable_sets(const model_spec& spec, const plan_options& o) {
  const std::size_t np = spec.params().size();
  std::vector<bool> now(np);
  bool any_frozen = false;
  for (param_id p = 0; p < np; ++p) {
    now[p] = spec.param(p).trainable;
    any_frozen = any_frozen || !now[p];
  }
  trainable_sets r;
  r.sets.push_back(now);
  ZSHARD_REQUIRE(o.unfreeze_stages.empty() || !o.frozen_params_stay_frozen, error_kind::config,
                 "plan_options lists unfreeze_stages and also says frozen parameters stay frozen",
                 "leave frozen_params_stay_frozen off when the run unfreezes parameters");
  if (o.unfreeze_stages.empty()) {
    if (any_frozen && !o.frozen_params_stay_frozen) r.sets.push_back(std::vector<bool>(np, true));
  } else {
    for (std::size_t k = 0; k < o.unfreeze_stages.size(); ++k) {
      for (const std::string& name : o.unfreeze_stages[k]) {
        const param_id p = spec.param_by_name(name);
        ZSHARD_REQUIRE(!spec.param(p).trainable, error_kind::config,
                       "plan_options::unfreeze_stages[" + std::to_string(k) + "] lists parameter '" + name +
                           "', which is trainable at registration",
                       "list only parameters registered with trainable = false (unfreezing one that trains changes "
                       "nothing)");
        now[p] = true;
      }
      r.sets.push_back(now);
    }
  }
  r.has_state = r.sets.back();
  return r;
}

// The larger of two ledger plans, category by category and in total.
inline void keep_larger(ledger_plan& into, const ledger_plan& other, const std::string& where) {
  for (std::size_t i = 0; i < mem_category_count; ++i) into.peak[i] = std::max(into.peak[i], other.peak[i]);
  if (other.total_peak > into.total_peak) {
    into.total_peak = other.total_peak;
    into.at_total_peak = other.at_total_peak;
    into.peak_phase = other.peak_phase + where;
  }
}

// `walk(trainable, has_state)` plans one trainable set; the first set's traffic is the plan's.
template <class Walk>
memory_plan plan_each_trainable_set(const model_spec& spec, const plan_options& o, Walk&& walk) {
  const trainable_sets t = resolve_trainable_sets(spec, o);
  memory_plan out = walk(t.sets[0], t.has_state);
  for (std::size_t k = 1; k < t.sets.size(); ++k) {
    const memory_plan next = walk(t.sets[k], t.has_state);
    const std::string where = o.unfreeze_stages.empty()
                                  ? std::string(" (with the parameters frozen at registration unfrozen)")
                                  : " (after unfreezing stage " + std::to_string(k) + ")";
    keep_larger(out.device, next.device, where);
    keep_larger(out.host, next.host, where);
    keep_larger(out.nvme, next.nvme, where);
    out.max_gathered_numel = std::max(out.max_gathered_numel, next.max_gathered_numel);
    out.steps_simulated = std::max(out.steps_simulated, next.steps_simulated);
  }
  out.trainable_sets = int(t.sets.size());
  return out;
}

}  // namespace zshard::plan::detail

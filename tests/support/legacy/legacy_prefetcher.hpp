#pragma once
// A Prefetcher with the second mechanism of the original failure (DESIGN.md, "the lesson"): the
// number of gathered elements is a free-running count kept by hand instead of being derived
// from the set of gathered parameters, and it is reset to zero at the step boundary.
//
//   - It adds the elements it asks to gather ahead, and subtracts a module's elements every
//     time a scope of that module opens ("in use now: no longer prefetched"), also for modules
//     that were gathered on demand or kept, which it never added. So the count drifts below
//     zero from the first scope on (and the step-boundary reset only starts the drift again).
//   - Its only guard on memory is that count: it keeps a parameter gathered after its scope
//     (to spare a re-gather) while count + numel <= max_live_numel. A count below zero keeps
//     everything: every parameter of the model ends up gathered.
//
// Test-only, with legacy_tracker.hpp and legacy_reducer.hpp. The legacy had no derived
// resident count, so runs that show it lift the engine's max_live_numel (which would
// otherwise evict what it keeps): what stops it is the device's memory, not zshard.
#include <cstdint>
#include <vector>

#include "zshard/prefetch/trace_prefetcher.hpp"

namespace legacy {

using namespace zshard;

class prefetch_count {
 public:
  using zshard_tag = prefetcher_tag;
  template <class Backend, class Comm>
  using impl = prefetch_count;

  void reset(const model_spec& spec, const std::vector<shard_layout>& layouts, const prefetch_config& cfg,
             const log_sink& log) {
    inner_.reset(spec, layouts, cfg, log);
    spec_ = &spec;
    max_live_ = std::int64_t(cfg.max_live_numel);
    numel_.assign(spec.params().size(), 0);
    for (param_id p = 0; p < spec.params().size(); ++p)
      if (!layouts[p].replicated) numel_[p] = std::int64_t(layouts[p].padded_numel);
    live_ = lowest_ = 0;
  }

  void on_scope_enter(module_id m, use_kind kind, std::vector<param_id>& ahead) {
    const std::size_t before = ahead.size();
    inner_.on_scope_enter(m, kind, ahead);
    for (std::size_t i = before; i < ahead.size(); ++i) live_ += numel_[ahead[i]];
    for (param_id p : spec_->module(m).params) live_ -= numel_[p];  // the drift: never added for on-demand gathers
    lowest_ = std::min(lowest_, live_);
  }

  bool keep_after_scope(param_id p) const { return live_ + numel_[p] <= max_live_ || inner_.keep_after_scope(p); }

  void on_step() {
    inner_.on_step();
    live_ = 0;  // reset instead of derived
  }

  std::int64_t live_count() const noexcept { return live_; }
  std::int64_t lowest_count() const noexcept { return lowest_; }

 private:
  prefetch::trace inner_;
  const model_spec* spec_ = nullptr;
  std::int64_t max_live_ = 0, live_ = 0, lowest_ = 0;
  std::vector<std::int64_t> numel_;
};

static_assert(check_prefetcher<prefetch_count>());

}  // namespace legacy

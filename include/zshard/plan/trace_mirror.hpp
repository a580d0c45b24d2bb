#pragma once
// The trace Prefetcher's decisions (prefetch/trace_prefetcher.hpp), replayed by the planner:
// the same state machine (record the first step, replay, drop to on-demand at a divergence,
// record again after it), the same window within prefetch_numel, and keep_after_scope in O(1)
// amortised instead of a scan (next use of each parameter found by a cursor that only moves
// forward within a step), so that planning stays linear in the size of the schedule.
//
// The Prefetcher's choices depend only on the sequence of scopes and the budgets, never on
// what the engine admitted: that is what lets the planner bound residency for every admission
// order (plan/gathered_bound.hpp).
#include <cstddef>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/partitioner.hpp"
#include "zshard/track/hook_tracker.hpp"

namespace zshard::plan::detail {

struct traced_scope {
  module_id module;
  use_kind kind;
  bool operator==(const traced_scope&) const = default;
};

// A recorded trace with what replaying it needs: element prefix sums and, per parameter, the
// positions that use it (compressed rows).
struct trace_index {
  std::vector<traced_scope> scopes;
  std::vector<std::size_t> prefix;     // prefix[i]: gathered elements of scopes before i
  std::vector<std::size_t> use_begin;  // uses of p: use_pos[use_begin[p] .. use_begin[p + 1])
  std::vector<std::size_t> use_pos;

  void build(std::vector<traced_scope> s, const model_spec& spec, const std::vector<std::size_t>& module_numel) {
    scopes = std::move(s);
    prefix.assign(scopes.size() + 1, 0);
    use_begin.assign(spec.params().size() + 1, 0);
    for (std::size_t i = 0; i < scopes.size(); ++i) {
      prefix[i + 1] = prefix[i] + module_numel[scopes[i].module];
      for (param_id p : spec.module(scopes[i].module).params) ++use_begin[p + 1];
    }
    for (std::size_t p = 0; p < spec.params().size(); ++p) use_begin[p + 1] += use_begin[p];
    use_pos.assign(use_begin.back(), 0);
    std::vector<std::size_t> fill(use_begin.begin(), use_begin.end() - 1);
    for (std::size_t i = 0; i < scopes.size(); ++i)
      for (param_id p : spec.module(scopes[i].module).params) use_pos[fill[p]++] = i;
  }
};

class trace_mirror {
 public:
  enum class state { recording, replaying, on_demand };

  trace_mirror(const model_spec& spec, const std::vector<shard_layout>& layouts, const prefetch_config& cfg,
               bool enabled)
      : spec_(spec), cfg_(cfg), enabled_(enabled) {
    module_numel_.assign(spec.modules().size(), 0);
    for (module_id m = 0; m < spec.modules().size(); ++m)
      for (param_id p : spec.module(m).params)
        if (!layouts[p].replicated) module_numel_[m] += layouts[p].padded_numel;
    cursor_.assign(spec.params().size(), 0);
  }

  state current() const noexcept { return state_; }
  // Which step's scopes the replayed trace came from (a caller's id); -1 when none.
  int trace_source() const noexcept { return state_ == state::replaying ? source_ : -1; }
  const std::vector<std::size_t>& module_numel() const noexcept { return module_numel_; }

  void begin_step(int source) {
    step_source_ = source;
    pos_ = frontier_ = window_numel_ = 0;
    recording_.clear();
    if (state_ == state::replaying)
      for (std::size_t p = 0; p < cursor_.size(); ++p) cursor_[p] = trace_.use_begin[p];
  }

  // prefetch::trace::on_scope_enter: the parameters it asks the engine to gather ahead.
  void enter(module_id m, use_kind kind, std::vector<param_id>& ahead) {
    if (!enabled_) return;
    if (state_ == state::recording) {
      recording_.push_back({m, kind});
      return;
    }
    if (state_ == state::on_demand) return;
    const auto& t = trace_.scopes;
    if (pos_ >= t.size() || t[pos_].module != m || t[pos_].kind != kind) {
      state_ = state::on_demand;
      return;
    }
    if (frontier_ > pos_)
      window_numel_ -= module_numel_[m];
    else {
      frontier_ = pos_ + 1;
      window_numel_ = 0;
    }
    ++pos_;
    while (frontier_ < t.size()) {
      const module_id next = t[frontier_].module;
      if (window_numel_ + module_numel_[next] > cfg_.prefetch_numel) break;
      for (param_id p : spec_.modules()[next].params) ahead.push_back(p);
      window_numel_ += module_numel_[next];
      ++frontier_;
    }
  }

  // prefetch::trace::keep_after_scope: p's next use, from the next trace position on, lies
  // within max_reuse_distance elements of scopes.
  bool keep(param_id p) {
    const std::size_t reach = cfg_.max_reuse_distance;
    if (state_ != state::replaying || reach == 0) return false;
    std::size_t& c = cursor_[p];
    const std::size_t end = trace_.use_begin[p + 1];
    while (c < end && trace_.use_pos[c] < pos_) ++c;
    return c < end && trace_.prefix[trace_.use_pos[c]] - trace_.prefix[pos_] <= reach;
  }

  // prefetch::trace::on_step.
  void end_step() {
    if (!enabled_) return;
    if (state_ == state::recording) {
      if (!recording_.empty()) {
        trace_.build(std::move(recording_), spec_, module_numel_);
        source_ = step_source_;
        state_ = state::replaying;
      }
    } else if (state_ == state::replaying && pos_ != trace_.scopes.size()) {
      state_ = state::recording;
    } else if (state_ == state::on_demand) {
      state_ = state::recording;
    }
    recording_.clear();
  }

 private:
  const model_spec& spec_;
  const prefetch_config& cfg_;
  const bool enabled_;
  std::vector<std::size_t> module_numel_;
  state state_ = state::recording;
  trace_index trace_;
  std::vector<traced_scope> recording_;
  std::vector<std::size_t> cursor_;  // per parameter: into trace_.use_pos, never behind pos_
  int source_ = -1, step_source_ = -1;
  std::size_t pos_ = 0, frontier_ = 0, window_numel_ = 0;
};

}  // namespace zshard::plan::detail

#pragma once
// The trace-based Prefetcher (the default): records the order of module scopes during the
// first step, then replays it. On entering the scope at trace position i it asks the engine
// to gather the parameters of the scopes after i, up to prefetch_numel elements ahead, and it
// advises keeping a parameter whose next use is within max_reuse_distance elements. When the
// model stops following the trace (a dynamic model), it drops to on-demand for the rest of
// the step, says so once, counts it, and records a fresh trace on the next step.
//
// The window of requested-but-not-yet-used scopes is kept incrementally, so a scope costs
// O(1) amortised however far ahead prefetch_numel reaches (models with thousands of small
// modules must not be bound by the Prefetcher). The reuse advice is an index into the trace,
// built once when a trace starts replaying: every parameter's trace positions, and the
// gathered elements before each position, so "is p used again within max_reuse_distance" is a
// binary search instead of a scan of the trace (7 us per scope at 4,096 modules).
#include <algorithm>
#include <string>
#include <vector>

#include "zshard/prefetch/prefetcher.hpp"

namespace zshard::prefetch {

class trace {
 public:
  using zshard_tag = prefetcher_tag;
  template <class Backend, class Comm>
  using impl = trace;

  void reset(const model_spec& spec, const std::vector<shard_layout>& layouts, const prefetch_config& cfg,
             const log_sink& log) {
    spec_ = &spec;
    cfg_ = cfg;
    log_ = log;
    module_numel_.assign(spec.modules().size(), 0);
    for (module_id m = 0; m < spec.modules().size(); ++m)
      for (param_id p : spec.modules()[m].params)
        if (!layouts[p].replicated) module_numel_[m] += layouts[p].padded_numel;
    state_ = state::recording;
    trace_.clear();
    recording_.clear();
    pos_ = frontier_ = window_numel_ = 0;
  }

  void on_scope_enter(module_id m, use_kind kind, std::vector<param_id>& ahead) {
    before_ = {state_, pos_, frontier_, window_numel_, recording_.size()};
    if (state_ == state::recording) {
      recording_.push_back({m, kind});
      return;
    }
    if (state_ == state::on_demand) return;
    if (pos_ >= trace_.size() || trace_[pos_].module != m || trace_[pos_].kind != kind) {
      diverge(m, kind);
      return;
    }
    // The scope at pos_ runs now: if it was requested ahead, it leaves the window.
    if (frontier_ > pos_) window_numel_ -= module_numel_[m];
    else {
      frontier_ = pos_ + 1;
      window_numel_ = 0;
    }
    ++pos_;
    const std::size_t budget = cfg_.prefetch_numel;
    while (frontier_ < trace_.size()) {
      const module_id next = trace_[frontier_].module;
      if (window_numel_ + module_numel_[next] > budget) break;
      for (param_id p : spec_->modules()[next].params) ahead.push_back(p);
      window_numel_ += module_numel_[next];
      ++frontier_;
    }
  }

  // The scope just entered could not be opened (the engine rolled it back): forget it, so a
  // retry replays (or records) it once.
  void on_scope_failed(module_id, use_kind) noexcept {
    state_ = before_.st;
    pos_ = before_.pos;
    frontier_ = before_.frontier;
    window_numel_ = before_.window_numel;
    recording_.resize(before_.recorded);
  }

  // True when p's next use at or after pos_ is at most max_reuse_distance gathered elements
  // (of the scopes in between, from pos_ on) away.
  bool keep_after_scope(param_id p) const {
    const std::size_t reach = cfg_.max_reuse_distance;
    if (state_ != state::replaying || reach == 0 || p >= uses_.size()) return false;
    const auto& u = uses_[p];
    const auto next = std::lower_bound(u.begin(), u.end(), pos_);
    return next != u.end() && numel_before_[*next] - numel_before_[pos_] <= reach;
  }

  void on_step() {
    if (state_ == state::recording) {
      trace_ = std::move(recording_);
      recording_.clear();
      state_ = trace_.empty() ? state::recording : state::replaying;
      if (state_ == state::replaying) index_trace();
    } else if (state_ == state::replaying && pos_ != trace_.size()) {
      diverge_at_step_end();
    } else if (state_ == state::on_demand) {
      state_ = state::recording;
    }
    pos_ = frontier_ = window_numel_ = 0;
  }

  std::size_t divergences() const noexcept { return divergences_; }
  // What one traced pass is called in its log lines ("step" unless a composite Prefetcher, such
  // as pass_trace, keeps a trace per kind of pass).
  void name_pass(const char* name) noexcept { pass_name_ = name; }
  bool replaying() const noexcept { return state_ == state::replaying; }
  std::size_t trace_length() const noexcept { return trace_.size(); }

 private:
  enum class state { recording, replaying, on_demand };
  struct entry {
    module_id module;
    use_kind kind;
  };

  // uses_[p]: trace positions whose module lists p, ascending; numel_before_[i]: gathered elements
  // of trace positions [0, i).
  void index_trace() {
    for (auto& u : uses_) u.clear();
    uses_.resize(spec_->params().size());
    numel_before_.assign(trace_.size() + 1, 0);
    for (std::size_t i = 0; i < trace_.size(); ++i) {
      const module_id m = trace_[i].module;
      for (param_id q : spec_->modules()[m].params) uses_[q].push_back(i);
      numel_before_[i + 1] = numel_before_[i] + module_numel_[m];
    }
  }

  // Names the use kind too: the same module entered as no_grad where the trace has a counted
  // use (an evaluation pass added mid-run) is a divergence as well.
  void diverge(module_id m, use_kind kind) {
    const auto describe = [&](module_id mod, use_kind k) {
      return "'" + spec_->module(mod).name + "' (" + std::string(to_string(k)) + ")";
    };
    const std::string expected = pos_ < trace_.size() ? describe(trace_[pos_].module, trace_[pos_].kind) : "the end";
    // A no-grad pass where the trace has a counted use, or the reverse, is almost always an
    // evaluation between training steps: say which policy keeps prefetching through it.
    const bool other_pass = pos_ < trace_.size() && (kind == use_kind::no_grad) != (trace_[pos_].kind == use_kind::no_grad);
    note("module " + describe(m, kind) + " at scope #" + std::to_string(pos_) + " where the trace has " + expected +
         (other_pass ? "; a no-grad pass (an evaluation?) between training steps: prefetch::pass_trace keeps one "
                       "trace per kind of pass and prefetches through both"
                     : ""));
    state_ = state::on_demand;
  }
  void diverge_at_step_end() {
    note("the " + std::string(pass_name_) + " ended after " + std::to_string(pos_) + " of " + std::to_string(trace_.size()) + " traced scopes");
    state_ = state::recording;
    recording_.clear();
  }
  void note(const std::string& what) {
    if (divergences_++ == 0)
      say(log_, "prefetch: the model left its recorded trace (" + what +
                "); prefetching is on-demand until a new trace is recorded (said once; see divergences()). A "
                "model that alternates kinds of passes (training steps, evaluations) keeps prefetching with "
                "prefetch::pass_trace (prefetch/pass_trace_prefetcher.hpp)");
  }

  struct position {
    state st;
    std::size_t pos, frontier, window_numel, recorded;
  };
  position before_{};  // before the last on_scope_enter

  const model_spec* spec_ = nullptr;
  prefetch_config cfg_{};
  log_sink log_{};
  std::vector<std::size_t> module_numel_;  // gathered elements of each module (replicated excluded)
  state state_ = state::recording;
  std::vector<entry> trace_, recording_;
  std::vector<std::vector<std::size_t>> uses_;  // the reuse index (index_trace)
  std::vector<std::size_t> numel_before_;
  std::size_t pos_ = 0;           // next trace position expected
  std::size_t frontier_ = 0;      // first trace position not yet requested ahead
  std::size_t window_numel_ = 0;  // elements requested ahead and not yet used
  std::size_t divergences_ = 0;
  const char* pass_name_ = "step";
};

static_assert(check_prefetcher<trace>());

}  // namespace zshard::prefetch

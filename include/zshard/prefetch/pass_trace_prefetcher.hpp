#pragma once
// prefetch::pass_trace: prefetch::trace (trace_prefetcher.hpp) with one trace per kind of pass. Records the order of module scopes during the
// first step, then replays it. On entering the scope at trace position i it asks the engine
// to gather the parameters of the scopes after i, up to prefetch_numel elements ahead, and it
// advises keeping a parameter whose next use is within max_reuse_distance elements. When the
// model stops following the trace (a dynamic model), it drops to on-demand for the rest of
// the pass, says so once, counts it, and records a fresh trace on the next one.
//
// Not yet the default: the memory planner mirrors prefetch::trace's single trace. One trace per kind of pass: training (counted forwards, recomputes, backwards; a pass ends at
// step()) and no-grad (a run of use_kind::no_grad scopes, such as an evaluation every N steps;
// it ends at the next scope of another kind, or at step()). A periodic evaluation between
// steps, or a no-grad pass inside one, leaves the training trace where it was: both replay.
//
// The window of requested-but-not-yet-used scopes is kept incrementally, so a scope costs
// O(1) amortised however far ahead prefetch_numel reaches (models with thousands of small
// modules must not be bound by the Prefetcher).
#include <string>
#include <vector>

#include "zshard/prefetch/prefetcher.hpp"

namespace zshard::prefetch {

class pass_trace {
 public:
  using zshard_tag = prefetcher_tag;
  template <class Backend, class Comm>
  using impl = pass_trace;

  void reset(const model_spec& spec, const std::vector<shard_layout>& layouts, const prefetch_config& cfg,
             const log_sink& log) {
    spec_ = &spec;
    cfg_ = cfg;
    log_ = log;
    module_numel_.assign(spec.modules().size(), 0);
    for (module_id m = 0; m < spec.modules().size(); ++m)
      for (param_id p : spec.module(m).params)
        if (!layouts[p].replicated) module_numel_[m] += layouts[p].padded_numel;
    passes_[0] = passes_[1] = pass{};
    in_no_grad_ = false;
  }

  void on_scope_enter(module_id m, use_kind kind, std::vector<param_id>& ahead) {
    const bool no_grad = kind == use_kind::no_grad;
    if (in_no_grad_ && !no_grad) end_pass(passes_[1], "no-grad pass");  // back to training
    in_no_grad_ = no_grad;
    enter(passes_[no_grad ? 1 : 0], m, kind, ahead);
  }

  bool keep_after_scope(param_id p) const {
    const pass& t = passes_[in_no_grad_ ? 1 : 0];
    const std::size_t reach = cfg_.max_reuse_distance;
    if (t.mode != state::replaying || reach == 0) return false;
    std::size_t distance = 0;
    for (std::size_t i = t.pos; i < t.trace.size() && distance <= reach; ++i) {
      const module_id m = t.trace[i].module;
      for (param_id q : spec_->module(m).params)
        if (q == p) return true;
      distance += module_numel_[m];
    }
    return false;
  }

  void on_step() {
    if (in_no_grad_) end_pass(passes_[1], "no-grad pass");
    in_no_grad_ = false;
    end_pass(passes_[0], "step");
  }

  std::size_t divergences() const noexcept { return divergences_; }
  // The training trace replays (the no-grad one: no_grad_replaying()).
  bool replaying() const noexcept { return passes_[0].mode == state::replaying; }
  bool no_grad_replaying() const noexcept { return passes_[1].mode == state::replaying; }
  std::size_t trace_length() const noexcept { return passes_[0].trace.size(); }

 private:
  enum class state { recording, replaying, on_demand };
  struct entry {
    module_id module;
    use_kind kind;
  };
  struct pass {
    state mode = state::recording;
    std::vector<entry> trace, recording;
    std::size_t pos = 0;           // next trace position expected
    std::size_t frontier = 0;      // first trace position not yet requested ahead
    std::size_t window_numel = 0;  // elements requested ahead and not yet used
  };

  void enter(pass& t, module_id m, use_kind kind, std::vector<param_id>& ahead) {
    if (t.mode == state::recording) {
      t.recording.push_back({m, kind});
      return;
    }
    if (t.mode == state::on_demand) return;
    if (t.pos >= t.trace.size() || t.trace[t.pos].module != m || t.trace[t.pos].kind != kind) {
      diverge(t, m, kind);
      return;
    }
    // The scope at pos runs now: if it was requested ahead, it leaves the window.
    if (t.frontier > t.pos) t.window_numel -= module_numel_[m];
    else {
      t.frontier = t.pos + 1;
      t.window_numel = 0;
    }
    ++t.pos;
    const std::size_t budget = cfg_.prefetch_numel;
    while (t.frontier < t.trace.size()) {
      const module_id next = t.trace[t.frontier].module;
      if (t.window_numel + module_numel_[next] > budget) break;
      for (param_id p : spec_->module(next).params) ahead.push_back(p);
      t.window_numel += module_numel_[next];
      ++t.frontier;
    }
  }

  // The pass is over: a recording becomes the trace; a replay that stopped short diverged.
  void end_pass(pass& t, const char* what) {
    if (t.mode == state::recording) {
      t.trace = std::move(t.recording);
      t.recording.clear();
      t.mode = t.trace.empty() ? state::recording : state::replaying;
    } else if (t.mode == state::replaying && t.pos != t.trace.size()) {
      note("the " + std::string(what) + " ended after " + std::to_string(t.pos) + " of " +
           std::to_string(t.trace.size()) + " traced scopes");
      t.mode = state::recording;
      t.recording.clear();
    } else if (t.mode == state::on_demand) {
      t.mode = state::recording;
    }
    t.pos = t.frontier = t.window_numel = 0;
  }

  // Names the use kind too: the same module entered as recompute where the trace has a counted
  // use is a divergence as well.
  void diverge(pass& t, module_id m, use_kind kind) {
    const auto describe = [&](module_id mod, use_kind k) {
      return "'" + spec_->module(mod).name + "' (" + std::string(to_string(k)) + ")";
    };
    const std::string expected = t.pos < t.trace.size() ? describe(t.trace[t.pos].module, t.trace[t.pos].kind) : "the end";
    note("module " + describe(m, kind) + " at scope #" + std::to_string(t.pos) + " where the trace has " + expected);
    t.mode = state::on_demand;
  }
  void note(const std::string& what) {
    if (divergences_++ == 0)
      say(log_, "prefetch: the model left its recorded trace (" + what +
                    "); prefetching is on-demand until a new trace is recorded (said once; see divergences())");
  }

  const model_spec* spec_ = nullptr;
  prefetch_config cfg_{};
  log_sink log_{};
  std::vector<std::size_t> module_numel_;  // gathered elements of each module (replicated excluded)
  pass passes_[2];                         // [0] training, [1] no-grad
  bool in_no_grad_ = false;                // the last scope entered was no_grad
  std::size_t divergences_ = 0;
};

static_assert(check_prefetcher<pass_trace>());

}  // namespace zshard::prefetch

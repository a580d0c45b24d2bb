#pragma once
// prefetch::pass_trace: prefetch::trace (trace_prefetcher.hpp) kept once per kind of pass.
// Training (counted forwards, recomputes, backwards; a pass ends at step()) and no-grad (a run
// of use_kind::no_grad scopes, such as an evaluation every N steps; it ends at the next scope of
// another kind, or at step()) each record and replay their own trace, so a periodic evaluation
// between steps, or a no-grad pass inside one, leaves the training trace where it was: both
// replay, and neither counts as a divergence of the other.
//
// Everything else (the prefetch window, the reuse index, divergence handling, the rollback of a
// scope that failed to open) is prefetch::trace's, per pass. A divergence is said once per kind
// of pass; divergences() counts both.
//
// Not yet the default: the memory planner mirrors prefetch::trace's single trace.
#include <vector>

#include "zshard/prefetch/prefetcher.hpp"
#include "zshard/prefetch/trace_prefetcher.hpp"

namespace zshard::prefetch {

class pass_trace {
 public:
  using zshard_tag = prefetcher_tag;
  template <class Backend, class Comm>
  using impl = pass_trace;

  void reset(const model_spec& spec, const std::vector<shard_layout>& layouts, const prefetch_config& cfg,
             const log_sink& log) {
    training_ = trace{};
    no_grad_ = trace{};
    training_.reset(spec, layouts, cfg, log);
    no_grad_.reset(spec, layouts, cfg, log);
    no_grad_.name_pass("no-grad pass");
    in_no_grad_ = false;
  }

  void on_scope_enter(module_id m, use_kind kind, std::vector<param_id>& ahead) {
    const bool no_grad = kind == use_kind::no_grad;
    if (in_no_grad_ && !no_grad) no_grad_.on_step();  // back to training: the no-grad pass is over
    in_no_grad_ = no_grad;
    current().on_scope_enter(m, kind, ahead);
  }

  // The pass that ended before the failed scope (if any) stays ended; only the failed scope is
  // forgotten, by the trace it entered.
  void on_scope_failed(module_id m, use_kind kind) noexcept { current().on_scope_failed(m, kind); }

  bool keep_after_scope(param_id p) const { return current().keep_after_scope(p); }

  void on_step() {
    if (in_no_grad_) no_grad_.on_step();
    in_no_grad_ = false;
    training_.on_step();
  }

  std::size_t divergences() const noexcept { return training_.divergences() + no_grad_.divergences(); }
  // The training trace replays (the no-grad one: no_grad_replaying()).
  bool replaying() const noexcept { return training_.replaying(); }
  bool no_grad_replaying() const noexcept { return no_grad_.replaying(); }
  std::size_t trace_length() const noexcept { return training_.trace_length(); }

 private:
  trace& current() noexcept { return in_no_grad_ ? no_grad_ : training_; }
  const trace& current() const noexcept { return in_no_grad_ ? no_grad_ : training_; }

  trace training_, no_grad_;
  bool in_no_grad_ = false;  // the last scope entered was no_grad
};

static_assert(check_prefetcher<pass_trace>());

}  // namespace zshard::prefetch

#pragma once
// The engine's micro-batch and step boundaries: end_backward(), step(), discard_gradients().
#include <cmath>
#include <cstddef>
#include <exception>
#include <string>

#include "zshard/core/error.hpp"
#include "zshard/engine/engine_checks.hpp"
#include "zshard/engine/grad_norm.hpp"
#include "zshard/engine/schedule_fingerprint.hpp"
#include "zshard/engine/step_report.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/optim/grad_clip.hpp"
#include "zshard/state/stream_roles.hpp"
#include "zshard/trace/rank_trace.hpp"
#include "zshard/track/hook_tracker.hpp"

namespace zshard {

template <class Engine>
class step_boundary {
 public:
  // Sweeps uses whose backward never ran (I3), flushes the Reducer and releases every
  // non-persistent gathered parameter.
  static void end_backward(Engine& e) {
    e.rethrow_if_unusable();
    ZSHARD_REQUIRE(e.scopes_.count() == 0, error_kind::usage,
                   "end_backward() with " + std::to_string(e.scopes_.count()) + " module scope(s) still open",
                   "a scope lives as long as its object: end each backward scope before end_backward(), e.g. "
                   "`{ auto g = eng.backward(m); ... }`");
    e.completed_.clear();
    const std::size_t swept_before = e.swept_.size();
    e.tracker_.on_end_backward(e.completed_, e.swept_);
    e.fp_.on_event(schedule_event::end_backward);
    log_swept(e, swept_before);
    {
      trace_span t(e.trace_, "reduce", "reduce-scatter (end of backward)");
      for (param_id p : e.completed_) e.ctl_.sync.complete(p, e.reduce_);
      e.ctl_.sync.end_backward(e.reduce_);  // gradients held by no-sync micro-batches, when sync is on again
      e.reducer_.flush(e.sink_);
    }
    // I7. With nothing held, a ledger without full gradients proves it at no cost; otherwise
    // (held gradients, another engine on the backend) every parameter is checked.
    if (e.ctl_.sync.holding() || e.backend_.ledger().current(mem_category::grad_buckets) != 0)
      engine_checks::no_full_gradient_left(e.store_, [&](param_id p) { return e.ctl_.sync.held(p); });
    trace_span t(e.trace_, "release", "release (end of backward)");
    e.residency_.end_holds();  // I3: holds end here
    e.check(e.residency_.resident_consistent(), "resident elements disagree with the gathered set (I5)");
    e.residency_.release_unpinned();
    e.check(e.store_.gathered_set().empty(), "parameters still gathered after end_backward");
    ++e.micro_batches_;
  }

  // Global gradient norm and overflow check, clipping, AdamW, new working shards over all
  // micro-batches since the last step. Every rank decides identically.
  static step_report step(Engine& e) {
    e.rethrow_if_unusable();
    ZSHARD_REQUIRE(e.scopes_.count() == 0, error_kind::usage, "step() with module scopes still open");
    e.tracker_.on_step();
    ZSHARD_REQUIRE(e.micro_batches_ > 0, error_kind::usage, "step() without a backward since the last step",
                   "run at least one forward/begin_backward/backward/end_backward before step(); end a "
                   "forward-only pass with end_pass()");
    ZSHARD_REQUIRE(!e.ctl_.sync.holding(), error_kind::usage,
                   "step() with " + std::to_string(e.ctl_.sync.held_count()) + " gradient(s) held unreduced (sync off)",
                   "run the last micro-batch before step() with set_gradient_sync(true)");
    step_report r;
    r.micro_batches = e.micro_batches_;
    r.swept = std::move(e.swept_);
    e.swept_.clear();

    e.store_.streams().order(stream_role::compute, stream_role::reduce);  // the Offloader reads gradient shards
    e.fp_.on_event(schedule_event::step);
    // Before anything is applied: ranks whose schedules or learning rates differ fail here, on
    // every rank (I9).
    global_grad_stats g;
    try {
      local_grad_norm local;
      {
        trace_span t(e.trace_, "optimizer", "gradient statistics (this rank's sums; waits for backward)");
        local = counted_grad_norm(e);
      }
      trace_span t(e.trace_, "wait", "gradient statistics exchange (waits for every rank)");
      g = e.agreement_.at_step(local, e.fp_, e.ctl_.groups, e.step_ + 1);
    } catch (...) {
      e.offloader_.discard_grads();
      e.broken_ = std::current_exception();
      throw;
    }
    e.fp_.start_step();
    const auto [norm, overflow] = g;
    const double denom = double(e.micro_batches_) * double(e.scaler_.scale());
    r.grad_norm = norm / denom;
    if (overflow) {
      r.skipped = true;
      r.grad_norm = INFINITY;
      e.offloader_.discard_grads();
    } else {
      r.clip_coefficient = optim::clip_coefficient(r.grad_norm, e.cfg_.clip_norm);
      trace_span t(e.trace_, "optimizer", "optimizer (AdamW, host copies)");
      e.offloader_.update({e.step_ + 1, e.lr(), static_cast<float>(r.clip_coefficient / denom), &e.ctl_.groups});
      ++e.step_;  // only once applied: a failed update (an NVMe I/O error) leaves the last completed step's count
    }
    e.publish_shards();
    e.scaler_.update(overflow);
    r.step = e.step_;
    r.loss_scale = e.scaler_.scale();
    e.micro_batches_ = 0;
    e.ctl_.scopes_since_boundary = 0;
    e.prefetcher_.on_step();
    trace_span t(e.trace_, "release", "release (step)");
    e.residency_.release_unpinned();
    e.check(e.store_.gathered_set().empty() && e.reducer_.pending_numel() == 0, "step boundary is not clean (I4)");
    e.check(e.residency_.resident_consistent(), "resident elements disagree with the gathered set (I5)");
    return r;
  }

  // Collective. Drops every gradient since the last step and resynchronises the schedule
  // across ranks (engine::discard_gradients() says when and why).
  static void discard_gradients(Engine& e) {
    e.rethrow_if_broken();
    ZSHARD_REQUIRE(e.scopes_.count() == 0, error_kind::usage, "discard_gradients() with module scopes still open",
                   "let the scopes of the failed micro-batch close (or unwind) first");
    e.agreement_.resynchronize(e.fp_);
    e.fp_.on_event(schedule_event::discard);
    if constexpr (requires { e.reducer_.discard(); })
      e.reducer_.discard();
    else
      e.reducer_.flush(e.sink_);
    for (param_id p = 0; p < e.store_.size(); ++p)
      e.store_[p].full_grad.reset_on(e.store_.streams().on(stream_role::compute));
    e.tracker_.reset(e.spec_);
    e.ctl_.sync.discard();
    e.residency_.end_holds();
    e.residency_.release_unpinned();
    e.offloader_.discard_grads();
    e.prefetcher_.on_step();
    e.micro_batches_ = 0;
    e.swept_.clear();
    e.abandoned_.clear();
  }

 private:
  // engine_config::log promises swept uses (I3): a forward whose backward never ran. Said once
  // per module, so a loop that sweeps every step does not flood the log; step_report::swept
  // lists every one.
  static void log_swept(Engine& e, std::size_t from) {
    for (std::size_t i = from; i < e.swept_.size(); ++i) {
      const module_id m = e.swept_[i].module;
      if (e.swept_said_.size() <= m) e.swept_said_.resize(e.spec_.modules().size(), false);
      if (e.swept_said_[m]) continue;
      e.swept_said_[m] = true;
      e.cfg_.say("swept " + std::to_string(e.swept_[i].pending_uses) + " use(s) of module '" + e.spec_.module(m).name +
                 "' whose backward never ran: released and reduced at end_backward (use use_kind::no_grad for "
                 "passes without backward; said once per module, step_report::swept lists every one)");
    }
  }

  // The step's gradient norm over the world counts each shard once: the replicas of a shard group
  // hold bitwise the same gradient shards, so only replica 0 adds its part (sum of squares, sum of
  // |g| or max |g|, engine/grad_norm.hpp; +0.0 from the others leaves a sum unchanged, bit for
  // bit, and a max too). An Inf/NaN is reported by every rank.
  static local_grad_norm counted_grad_norm(Engine& e) {
    local_grad_norm g = local_grad_norm_of(e.offloader_, e.cfg_.clip_norm_type);
    if (e.replica_index() != 0) g.part = 0.0;
    return g;
  }
};

}  // namespace zshard

#pragma once
// Opening, closing and abandoning the engine's module scopes (gathers, gradient buffers, rollback).
#include <array>
#include <exception>
#include <span>
#include <string>

#include "zshard/backend/backend.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/error.hpp"
#include "zshard/engine/engine_checks.hpp"
#include "zshard/engine/schedule_fingerprint.hpp"
#include "zshard/engine/training_controls.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/state/stream_roles.hpp"
#include "zshard/trace/rank_trace.hpp"
#include "zshard/track/hook_tracker.hpp"

namespace zshard {

template <class Engine>
class scope_lifecycle {
  using backend_type = typename Engine::backend_type;
  using scope = typename Engine::scope;
  using controls = training_controls<Engine>;

 public:
  // Exception-safe: the residency rolls back its own pins and gathers, gradient buffers made
  // here are freed, the tracker is told last (its checks throw before it changes anything) and
  // the fingerprint is restored, so a failed open leaves the engine as it was.
  static void enter(Engine& e, module_id m, use_kind kind, bool is_backward) {
    e.rethrow_if_unusable();
    engine_checks::module_id_in_range(e.spec_, m, "engine scope (forward/recompute/backward)");
    e.scopes_.check_can_open(e.spec_, m, is_backward);
    if (is_backward)  // a usage error here changes nothing
      e.tracker_.on_backward(m);
    else
      e.tracker_.on_forward(m, kind);
    const auto saved = e.fp_.save();
    e.fp_.on_scope(m, kind, is_backward);
    controls::count_scope(e);
    e.fp_.write_tag(e.store_.collective_context, collective_use::gather, m);
    e.made_count_ = 0;
    int stage = 0;  // 1: the Prefetcher saw the scope, 2: the residency opened it
    try {
      if (e.cfg_.check_every_scope) e.agreement_.at_scope(e.fp_);
      e.ahead_.clear();
      e.prefetcher_.on_scope_enter(m, kind, e.ahead_);
      stage = 1;
      {
        trace_span t(e.trace_, "gather", e.ahead_.empty() ? "gather" : "gather + prefetch", e.spec_.modules()[m].name);
        e.residency_.open(m, e.ahead_, e.store_.collective_context);
      }
      stage = 2;
      if (is_backward) make_full_grads(e, m);
    } catch (const error& err) {
      undo_open(e, m, kind, is_backward, stage, saved);
      if (err.kind() != error_kind::comm) throw;
      throw error(err.kind(),
                  err.message() + " [rank " + std::to_string(e.comm_.rank()) + " was opening " +
                      engine_checks::scope_name(e.spec_, m, kind, is_backward) + " as scope #" +
                      std::to_string(e.fp_.scopes() + 1) + "]",
                  err.hint());
    } catch (...) {
      undo_open(e, m, kind, is_backward, stage, saved);
      throw;
    }
    if (e.trace_) [[unlikely]]
      e.trace_->scope_open(m, is_backward ? "backward" : kind == use_kind::counted ? "forward" : to_string(kind));
  }

  // A failure half-way through closing a scope (a collective in the Reducer, an invariant)
  // leaves pins and counts inconsistent, so it breaks the engine: every later call rethrows it.
  static void exit(Engine& e, scope* sc) {
    e.rethrow_if_broken();
    const module_id m = sc->module();
    const bool is_backward = sc->is_backward();
    sc->end();
    e.scopes_.ended(sc, m, is_backward);
    try {
      if (e.trace_) [[unlikely]]
        e.trace_->scope_close(m, is_backward, e.spec_.modules()[m].name);
      e.store_.streams().note_work(stream_role::compute);  // the scope's own kernels, before any reduction of them
      if (is_backward) {
        e.completed_.clear();
        e.tracker_.on_backward_done(m, e.completed_);
        trace_span t(e.trace_, "reduce", "reduce-scatter", e.spec_.modules()[m].name);
        for (param_id p : e.completed_) e.ctl_.sync.complete(p, e.reduce_);
      }
      trace_span t(e.trace_, "release", "release", e.spec_.modules()[m].name);
      e.residency_.close(m, e.tracker_.keeps_gathered(m), controls::prefers_gathered(e, m));
    } catch (...) {
      e.broken_ = std::current_exception();
      throw;
    }
  }

  // A scope destroyed by an exception: released without a collective; the engine then waits
  // for discard_gradients().
  static void abandon(Engine& e, scope* sc) noexcept {
    const module_id m = sc->module();
    const bool is_backward = sc->is_backward();
    sc->end();
    e.scopes_.ended(sc, m, is_backward);
    try {
      e.abandoned_ = engine_checks::scope_name(e.spec_, m, use_kind::counted, is_backward);
      e.residency_.close(m, false, false);
    } catch (...) {
      if (!e.broken_) e.broken_ = std::current_exception();
    }
  }

 private:
  // The scope's new gradient buffers, zeroed on compute: with one launch per two dozen where the
  // backend batches (batched_fill_zero), else a fill_zero each.
  static void make_full_grads(Engine& e, module_id m) {
    auto& compute = e.store_.streams().on(stream_role::compute);
    const auto& params = e.spec_.modules()[m].params;  // m checked by enter
    if (e.made_grads_.size() < params.size()) e.made_grads_.resize(params.size());
    constexpr std::size_t batch = 24;
    std::array<void*, batch> zero_at{};
    std::array<std::size_t, batch> zero_bytes{};
    std::size_t pending = 0;
    const auto flush = [&] {
      if constexpr (batched_fill_zero<backend_type>)
        e.backend_.fill_zero_batch(std::span<void* const>(zero_at.data(), pending),
                                   std::span<const std::size_t>(zero_bytes.data(), pending), compute);
      pending = 0;
    };
    for (param_id p : params) {
      auto& s = e.store_[p];
      if (!e.ctl_.trainable[p] || s.full_grad) continue;
      s.full_grad =
          buffer<backend_type>(e.backend_, dtype::f32, s.layout.padded_numel, mem_category::grad_buckets, compute);
      e.made_grads_[e.made_count_++] = p;
      if constexpr (batched_fill_zero<backend_type>) {
        zero_at[pending] = s.full_grad.data();
        zero_bytes[pending++] = s.full_grad.bytes();
        if (pending == batch) flush();
      } else {
        e.backend_.fill_zero(s.full_grad.data(), s.full_grad.bytes(), compute);
      }
    }
    if (pending) flush();
  }

  // Rolls back a scope whose open failed; the policies that can take back what they were told
  // (optional on_scope_failed, see track/hook_tracker.hpp and prefetch/prefetcher.hpp) do.
  static void undo_open(Engine& e, module_id m, use_kind kind, bool is_backward, int stage,
                        const schedule_fingerprint::saved& saved) noexcept {
    e.fp_.restore(saved);
    for (std::size_t i = 0; i < e.made_count_; ++i)
      e.store_[e.made_grads_[i]].full_grad.reset_on(e.store_.streams().on(stream_role::compute));
    try {
      if (stage >= 2) e.residency_.close(m, false, false);
      if constexpr (requires { e.prefetcher_.on_scope_failed(m, kind); })
        if (stage >= 1) e.prefetcher_.on_scope_failed(m, kind);
      if constexpr (requires { e.tracker_.on_scope_failed(m, kind, is_backward); })
        e.tracker_.on_scope_failed(m, kind, is_backward);
    } catch (...) {
      e.broken_ = std::current_exception();
    }
  }
};

}  // namespace zshard

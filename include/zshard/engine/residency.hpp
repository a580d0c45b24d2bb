#pragma once
// Which parameters are gathered, and why: pinned by an open scope, held, or gathered ahead /
// kept for reuse by the Prefetcher (advisory). Owns invariant I5: resident elements stay within
// max_live_numel, except one module larger than it alone, while its scope is open, when
// allow_oversized_module is set. When such a scope closes, what it would leave gathered above
// the budget (the Prefetcher's keep for reuse, a preferred hold) is released at once, so that
// with no scope open the budget holds again (the memory planner relies on it: plan/gathered_bound.hpp).
//
// Holds come in two kinds. A binding hold (the HookTracker's keeps_gathered) is never evicted,
// so the budget check can fail on it. A preferred hold (the HookTracker's prefers_gathered: the
// default tracker's recomputed module waiting for its backward; a module kept gathered from
// forward to backward, engine::set_keep_gathered_until_backward) saves a second gather but
// yields to the budget: when a scope needs room, make_room evicts what the Prefetcher gathered
// or kept that is not wanted soon, then what it asked for just now, and last preferred holds.
// A module evicted that way is gathered again when its next scope opens (hold_evictions()
// counts it). So with the default tracker a tight budget never fails on a hold: with
// max_live_numel = an outer module + its largest inner module, nested activation checkpointing
// (recomputed inner modules held while their siblings recompute) runs in budget
// (tests/engine/test_nested_checkpoint_budget.cpp).
//
// This bookkeeping (pins, holds, the gather marks) is the engine's own: policies never see it,
// and only this class holds the residency_key that moves a parameter between sharded and
// gathered (state/param_store.hpp).
//
// Gathers are collectives: every rank makes the same decisions in the same order, since they
// depend only on the model, the layouts, the budgets and the sequence of scopes. They run on
// the gather stream; the compute stream waits for m's gathers before the scope hands out its
// parameters, but not for the gathers ahead issued after that wait: those run while m computes.
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/param_table.hpp"
#include "zshard/prefetch/prefetch_config.hpp"
#include "zshard/state/param_store.hpp"

namespace zshard {

template <class Backend, class Comm, class Prefetcher>
class residency {
 public:
  residency(param_store<Backend>& store, Comm& comm, Prefetcher& prefetcher, const prefetch_config& cfg)
      : store_(store),
        comm_(comm),
        prefetcher_(prefetcher),
        cfg_(cfg),
        entries_(store.size()),
        held_(store.spec().modules().size(), hold::none) {}

  // A scope of m opens: make room, gather and pin m's parameters, check the budget, make
  // compute wait for their gathers (those issued now, or ahead earlier), then gather what the
  // Prefetcher asked for ahead while it fits. Each set of gathers is launched as one group
  // where the communicator can; each gather carries `context` (the scope's identity) with its
  // parameter, so ranks gathering different things fail instead of mixing them (I9).
  //
  // Exception-safe: if anything fails (the live budget, an allocation), m's pins are undone and
  // what this call gathered for m is released, so the engine stays usable.
  // (`context` by reference: the engine has just written it, and a copy taken at the call
  // would read it back before the stores land, a stall per scope.)
  void open(module_id m, const std::vector<param_id>& ahead, const collective_tag& context) {
    bool pinned = false;
    try {
      if (make_room(m, ahead)) {  // (usually all gathered ahead already)
        gather_group(params(m), context, collective_use::gather, [](param_id) { return true; });
      }
      for (param_id p : params(m)) ++entries_[p].pins;
      pinned = true;
      check_live_budget(m);
      for (param_id p : params(m)) await_gather(p);
      gather_group(ahead, context, collective_use::gather_ahead, [&](param_id q) {
        return store_.resident_numel() + store_[q].layout.padded_numel <= cfg_.max_live_numel;
      });
    } catch (...) {
      for (param_id p : params(m)) {
        if (pinned) --entries_[p].pins;
        if (evictable(p)) release(p);
      }
      throw;
    }
  }

  // A scope of m closes; `binding` / `preferred`: whether m stays gathered, and how firmly (see
  // the header comment). The hold is taken before unpinning, so a held module is never
  // released in between.
  void close(module_id m, bool binding, bool preferred) {
    set_hold(m, binding ? hold::binding : preferred ? hold::preferred : hold::none);
    for (param_id p : params(m)) {
      auto& e = entries_[p];
      if (e.pins <= 0) throw error(error_kind::invariant, "unbalanced pins on parameter '" + store_[p].spec->name + "'");
      --e.pins;
      release_if_unused(p);
    }
    // Only an oversized module's scope leaves more than max_live_numel behind: the budget
    // binds again as soon as it stops executing (I5).
    if (store_.resident_numel() > cfg_.max_live_numel) [[unlikely]]
      evict_until(0, {}, {});
  }

  // End of backward (I3): no hold survives it.
  void end_holds() {
    for (module_id m = 0; m < held_.size(); ++m) set_hold(m, hold::none);
  }

  // Releases every gathered parameter no open scope uses.
  void release_unpinned() {
    for (std::size_t i = store_.gathered_set().size(); i-- > 0;) {
      const param_id p = store_.gathered_set()[i];
      if (entries_[p].pins == 0) release(p);
    }
  }

  // I5 cross-check: the resident figure against the gathered buffers that exist. Each member of
  // the gathered set holds its buffer and the figure is their sum; the ledger then proves that
  // no gathered buffer lives outside the set (its gathered_params bytes equal the set's), so a
  // check costs the set, not the model. Only when the ledger holds more (another engine on the
  // same backend, or a leak) is every parameter scanned.
  bool resident_consistent() const {
    std::size_t numel = 0, bytes = 0;
    for (param_id p : store_.gathered_set()) {
      const auto& g = store_[p].gathered();
      if (!g) return false;
      numel += store_[p].layout.padded_numel;
      bytes += g.bytes();
    }
    if (numel != store_.resident_numel()) return false;
    return bytes == store_.backend().ledger().current(mem_category::gathered_params) ||
           resident_by_scan() == store_.resident_numel();
  }

  // The resident figure recomputed by scanning every parameter.
  std::size_t resident_by_scan() const {
    std::size_t n = 0;
    for (param_id p = 0; p < store_.size(); ++p)
      if (store_[p].gathered()) n += store_[p].layout.padded_numel;
    return n;
  }

  // Elements m's scope gathers (replicated parameters are always resident and not counted).
  std::size_t module_gathered_numel(module_id m) const {
    std::size_t n = 0;
    for (param_id p : params(m))
      if (!store_[p].layout.replicated) n += store_[p].layout.padded_numel;
    return n;
  }

  // Open scopes using p, and modules held gathered (either kind) that list p.
  int pins(param_id p) const noexcept { return entries_[p].pins; }
  int holds(param_id p) const noexcept { return entries_[p].holds + entries_[p].preferred; }
  // Parameters under a preferred hold released to make room for a scope (each is gathered
  // again when next used).
  std::size_t hold_evictions() const noexcept { return hold_evictions_; }

 private:
  enum class hold : unsigned char { none, preferred, binding };
  struct entry {
    int pins = 0;       // open scopes using this parameter
    int holds = 0;      // modules under a binding hold that list this parameter
    int preferred = 0;  // modules under a preferred hold that list this parameter
    // The end of p's gather on the gather stream, until compute has waited for it.
    typename stream_roles<Backend>::mark gather_done{};
  };

  // Unchecked: m was checked where the engine took it.
  const std::vector<param_id>& params(module_id m) const { return store_.spec().modules()[m].params; }

  // Gathered but neither in use nor held: released when no scope uses it (unless the Prefetcher
  // keeps it), and the first to go when a scope needs room.
  bool evictable(param_id p) const noexcept {
    const auto& e = entries_[p];
    return store_[p].gathered() && e.pins == 0 && e.holds == 0 && e.preferred == 0;
  }

  // Gathers the parameters of `wanted` not yet gathered that `admit` lets in, as one group,
  // then marks the group's end on the gather stream for each (a group's collectives run at
  // its end, so the mark must come after it). The gathered buffers are allocated in the compute
  // stream's order (param_store::begin_gather), so the gather stream first waits for compute up
  // to that point: the kernels of the scopes before this one, not this scope's, which are
  // enqueued after it. When a collective fails, the ones issued before it keep their mark
  // (their buffers are freed on compute after waiting for it) and the rest go back to sharded.
  template <class Admit>
  // (The tag is built per gather from `context` and `use`: a tag passed by value is copied
  // through the stack right after its fields were written, a stalled load per scope.)
  void gather_group(const std::vector<param_id>& wanted, const collective_tag& context, collective_use use,
                    Admit&& admit) {
    issued_ = 0;
    begun_.clear();
    try {
      for (param_id p : wanted) {
        if (store_[p].is_gathered() || !admit(p)) continue;
        store_.begin_gather(p, {});
        begun_.push_back(p);
      }
    } catch (...) {  // an allocation failed: nothing was issued, the buffers go back where they were allocated
      for (param_id p : begun_) store_.release(p, {});
      throw;
    }
    if (begun_.empty()) return;
    store_.streams().order(stream_role::gather, stream_role::compute);
    try {
      grouped(comm_, [&] {
        for (param_id p : begun_) {
          auto& s = store_[p];
          collective_tag tag = context;
          tag.use = use;
          tag.param = p;
          const void* src = store_.gather_source(p, stream_role::gather);  // staged when offloaded
          tagged::all_gather(comm_, src, s.gathered().data(), s.layout.shard_numel, s.type,
                             store_.streams().collective_on(stream_role::gather), tag);
          ++issued_;
        }
      });
    } catch (...) {
      store_.gathers_issued(stream_role::gather);  // offloaded shards' staged copies (param_store.hpp)
      // The one that failed and those never issued: back to sharded, freed on the gather stream,
      // which waited for their allocation and is where any part of the failed collective went.
      for (std::size_t i = issued_; i < begun_.size(); ++i) store_.abandon_gather(begun_[i], {});
      mark_issued();  // what was gathered before the failure stays ordered
      throw;
    }
    store_.gathers_issued(stream_role::gather);
    mark_issued();
  }

  void mark_issued() {
    if (issued_ == 0 || !store_.streams().overlapped()) return;  // one stream: nothing to wait for
    const auto done = store_.streams().mark_now(stream_role::gather);
    for (std::size_t i = 0; i < issued_; ++i) entries_[begun_[i]].gather_done = done;
  }

  // Compute waits for p's gather (once): before a scope hands p out, and before freeing it.
  void await_gather(param_id p) {
    if (store_[p].state() != param_state::gathering) return;
    auto& e = entries_[p];
    store_.streams().wait_for(stream_role::compute, e.gather_done);
    e.gather_done = {};
    store_.finish_gather(p, {});
  }

  // Frees p's gathered buffer in the compute stream's order, after its gather (which compute
  // may not have waited for yet: a parameter gathered ahead can be evicted unused).
  void release(param_id p) {
    auto& e = entries_[p];
    store_.streams().wait_for(stream_role::compute, e.gather_done);
    e.gather_done = {};
    store_.release(p, {});
  }

  void release_if_unused(param_id p) {
    if (evictable(p) && !prefetcher_.keep_after_scope(p)) release(p);
  }

  void set_hold(module_id m, hold h) {
    const hold old = held_[m];
    if (old == h) return;
    held_[m] = h;
    for (param_id p : params(m)) {
      auto& e = entries_[p];
      if (old == hold::binding) --e.holds;
      if (old == hold::preferred) --e.preferred;
      if (h == hold::binding) ++e.holds;
      if (h == hold::preferred) ++e.preferred;
      release_if_unused(p);
    }
  }

  // Evicts parameters neither pinned nor under a binding hold until m's missing parameters fit
  // under max_live_numel, or nothing is left to evict: first those not held and not wanted
  // soon, then those the Prefetcher asked for just now, last those under a preferred hold (see
  // the header comment). m's own stay.
  // Returns whether any of m's parameters is not gathered.
  bool make_room(module_id m, const std::vector<param_id>& ahead) {
    std::size_t needed = 0;
    bool missing = false;
    for (param_id p : params(m))
      if (!store_[p].is_gathered()) {
        needed += store_[p].layout.padded_numel;
        missing = true;
      }
    if (store_.resident_numel() + needed > cfg_.max_live_numel) evict_until(needed, params(m), ahead);
    return missing;
  }

  // make_room's eviction: until `needed` more elements fit under max_live_numel, never `own`.
  void evict_until(std::size_t needed, std::span<const param_id> own, std::span<const param_id> ahead) {
    const std::size_t budget = cfg_.max_live_numel;
    for (int pass = 0; pass < 3 && store_.resident_numel() + needed > budget; ++pass) {
      for (std::size_t i = store_.gathered_set().size(); i-- > 0 && store_.resident_numel() + needed > budget;) {
        const param_id p = store_.gathered_set()[i];
        const auto& e = entries_[p];
        if (e.pins != 0 || e.holds != 0 || std::find(own.begin(), own.end(), p) != own.end()) continue;
        const bool held = e.preferred != 0;
        if (held != (pass == 2)) continue;
        const bool wanted_soon = std::find(ahead.begin(), ahead.end(), p) != ahead.end();
        if (pass == 0 && wanted_soon) continue;
        if (held) ++hold_evictions_;
        release(p);
      }
    }
  }

  void check_live_budget(module_id m) const {
    const std::size_t resident = store_.resident_numel();
    if (resident <= cfg_.max_live_numel) return;
    const bool alone = cfg_.allow_oversized_module && resident == module_gathered_numel(m);
    ZSHARD_REQUIRE(alone, error_kind::budget,
                   "gathering module '" + store_.spec().module(m).name + "' makes " + std::to_string(resident) +
                       " elements resident, above max_live_numel = " + std::to_string(cfg_.max_live_numel),
                   "close enclosing scopes sooner, or raise max_live_numel");
  }

  param_store<Backend>& store_;
  Comm& comm_;
  Prefetcher& prefetcher_;
  const prefetch_config& cfg_;
  param_table<entry> entries_;    // per parameter
  std::vector<hold> held_;        // per module: how it is held gathered
  std::vector<param_id> begun_;   // the group's parameters whose buffers are allocated
  std::size_t issued_ = 0;        // how many of them (the first) had their gather issued
  std::size_t hold_evictions_ = 0;
};

}  // namespace zshard

#pragma once
// The planner's bound on gathered parameters (ledger category gathered_params): the one term of
// a plan that depends on the run, namely which gathers ahead the engine admits (first fit, in
// request order, while resident elements stay within max_live_numel) and which advisory
// parameters it evicts to make room. plan_walk.hpp drives this model event by event; it bounds
// the run's gathered bytes for every admission and eviction order, as follows.
//
//   Let U(t) be the parameters resident at point t of a run with an unbounded max_live_numel
//   (every request admitted, nothing evicted); this model computes U exactly. Claim: the real
//   run's resident set R(t) is a subset of U(t) at every t. By induction over engine events,
//   both runs seeing the same Prefetcher and HookTracker decisions (those depend only on the
//   sequence of scopes, never on residency; trace_mirror.hpp):
//    - a scope opens: both gather its own parameters; R gathers a subset of the requests ahead
//      that U gathers all of; R may also evict (only shrinks R). So R ⊆ U after.
//    - a scope closes / a hold ends: p leaves U iff p is unpinned, unheld (binding or preferred)
//      and not kept by the Prefetcher; pins, holds and keeps are the same in both runs, so p
//      leaves R then too. (A preferred hold, engine/residency.hpp, may also be evicted from R,
//      and so may anything a closing oversized module leaves behind: that only shrinks R.)
//    - end_backward and step release everything unpinned from both.
//   Let P(t) be the pinned (open scopes) and bindingly held (HookTracker keeps_gathered)
//   parameters: P ⊆ R, since both are gathered and never evictable. Preferred holds (the default
//   tracker's recomputed modules, plan_options::keep_gathered_until_backward) are evictable, so
//   they sit in U \ P like the Prefetcher's keeps. The engine keeps |R| ≤ max_live_numel (I5),
//   except while a module larger than it executes (allow_oversized_module): then R = P is that
//   module alone (the walk checks that it is, else the engine would throw), and when its scope
//   closes the engine evicts what it left above the budget (engine/residency.hpp).
//   So R = P ∪ A with A ⊆ U \ P and |A| ≤ max_live_numel − |P|, and
//      bytes(R) ≤ bytes(P) + max { bytes(A) : A ⊆ U \ P, |A| ≤ max_live_numel − |P| },
//   which is bounded by filling the room with the widest elements of U \ P first (the
//   fractional knapsack, an upper bound of the integral one). Between events R only shrinks
//   (gathers happen in scope openings, whose end state includes every intermediate one), so
//   the figure after each event bounds the run until the next: the plan bounds the run's
//   gathered_params at every moment, for any order of admission and eviction. When
//   max_live_numel does not bind, U = R and the bound is exact.
//
//   A Prefetcher the planner does not mirror (prefetch_policy::any) may ask for any parameter
//   ahead at any scope and keep it: then U is every sharded parameter from the first scope
//   opening after a release of everything (end_backward, step) on, and the same argument
//   bounds R by P plus the widest parameters that fit in the budget left. Only the live budget
//   is assumed of such a Prefetcher, and the engine enforces that whatever the Prefetcher asks.
#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include "zshard/core/dtype.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/partitioner.hpp"

namespace zshard::plan::detail {

class gathered_bound {
 public:
  // `any_prefetcher`: the run's Prefetcher is not mirrored; assume it gathers anything ahead.
  gathered_bound(const model_spec& spec, const std::vector<shard_layout>& layouts, dtype param_dtype,
                 std::size_t max_live_numel, bool any_prefetcher)
      : spec_(spec), layouts_(layouts), live_(max_live_numel), any_(any_prefetcher) {
    const std::size_t np = spec.params().size(), nm = spec.modules().size();
    elem_.resize(np);
    for (param_id p = 0; p < np; ++p) {
      elem_[p] = size_of(spec.param(p).type.value_or(param_dtype));
      if (!layouts[p].replicated) all_numel_[elem_[p]] += std::ptrdiff_t(layouts[p].padded_numel);
    }
    resident_.assign(np, false);
    pins_.assign(np, 0);
    holds_.assign(np, 0);
    preferred_.assign(np, 0);
    held_module_.assign(nm, false);
    preferred_module_.assign(nm, false);
  }

  // U gains p (a scope's own parameter, or one asked for ahead); false when p is replicated or
  // already there (no gather).
  bool gather(param_id p) {
    if (layouts_[p].replicated || resident_[p]) return false;
    resident_[p] = true;
    resident_list_.push_back(p);
    account(p, +1);
    return true;
  }
  // A scope opens: with a Prefetcher not mirrored, anything may be gathered ahead from now on.
  void scope_opened() { anything_ = any_; }

  void pin(param_id p, int delta) {
    change(p, [&] { pins_[p] += delta; });
  }

  // p leaves U when nothing keeps it: no pin, no hold of either kind, and not the Prefetcher's
  // (`kept_by_prefetcher()` is asked last, only then).
  template <class Keep>
  void release_if_unused(param_id p, Keep&& kept_by_prefetcher) {
    if (!resident_[p] || fixed(p) || preferred_[p] > 0 || kept_by_prefetcher()) return;
    account(p, -1);
    resident_[p] = false;
  }

  // A binding hold of m (the HookTracker's keeps_gathered): in P.
  template <class Keep>
  void hold(module_id m, bool on, Keep&& keep) {
    if (held_module_[m] == on) return;
    held_module_[m] = on;
    if (on) held_list_.push_back(m);
    for (param_id p : spec_.modules()[m].params) {
      change(p, [&] { holds_[p] += on ? 1 : -1; });
      if (!on) release_if_unused(p, [&] { return keep(p); });
    }
  }
  // A preferred hold of m (engine/residency.hpp): kept resident like the Prefetcher's keep, in
  // the free part of the bound (evictable under max_live_numel), never in the fixed part.
  template <class Keep>
  void prefer(module_id m, bool on, Keep&& keep) {
    if (preferred_module_[m] == on) return;
    preferred_module_[m] = on;
    if (on) preferred_list_.push_back(m);
    for (param_id p : spec_.modules()[m].params) {
      preferred_[p] += on ? 1 : -1;
      if (!on) release_if_unused(p, [&] { return keep(p); });
    }
  }
  // End of backward (I3): no hold survives it.
  template <class Keep>
  void end_holds(Keep&& keep) {
    for (module_id m : held_list_) hold(m, false, keep);
    held_list_.clear();
    for (module_id m : preferred_list_) prefer(m, false, keep);
    preferred_list_.clear();
  }

  // engine::end_backward and engine::step: no scope is open, so nothing stays gathered.
  void release_all() {
    for (param_id p : resident_list_)
      if (resident_[p]) {
        account(p, -1);
        resident_[p] = false;
      }
    resident_list_.clear();
    anything_ = false;
  }

  // Elements pinned or bindingly held now (P).
  std::size_t fixed_numel() const noexcept {
    std::ptrdiff_t n = 0;
    for (auto x : fixed_numel_) n += x;
    return std::size_t(n);
  }

  // The bound on gathered bytes now (see the proof at the top); also tracks the largest
  // resident element count it allows (the plan's I5 figure).
  std::size_t bytes() {
    const std::size_t fixed = fixed_numel();
    std::size_t bytes = 0;
    for (std::size_t w = 1; w < fixed_numel_.size(); ++w) bytes += w * std::size_t(fixed_numel_[w]);
    if (fixed >= live_) {
      max_numel_ = std::max(max_numel_, fixed);
      return bytes;
    }
    std::size_t room = live_ - fixed;
    for (std::size_t w = free_numel_.size(); w-- > 1 && room > 0;) {
      const std::size_t free = std::size_t(anything_ ? all_numel_[w] - fixed_numel_[w] : free_numel_[w]);
      const std::size_t take = std::min(room, free);
      bytes += take * w;
      room -= take;
    }
    max_numel_ = std::max(max_numel_, live_ - room);
    return bytes;
  }
  std::size_t max_numel() const noexcept { return max_numel_; }

 private:
  bool fixed(param_id p) const { return pins_[p] > 0 || holds_[p] > 0; }
  // Adds (+1) or removes (-1) p's share of the sums the bound reads.
  void account(param_id p, int sign) {
    if (!resident_[p]) return;
    const std::ptrdiff_t n = sign * std::ptrdiff_t(layouts_[p].padded_numel);
    (fixed(p) ? fixed_numel_ : free_numel_)[elem_[p]] += n;
  }
  template <class Change>
  void change(param_id p, Change&& c) {
    account(p, -1);
    c();
    account(p, +1);
  }

  const model_spec& spec_;
  const std::vector<shard_layout>& layouts_;
  const std::size_t live_;
  const bool any_;
  bool anything_ = false;  // any_ and a scope opened since the last release_all
  std::vector<std::size_t> elem_;  // bytes per element, per parameter
  std::vector<bool> resident_;     // U
  std::vector<param_id> resident_list_;
  std::vector<int> pins_, holds_, preferred_;  // per parameter (preferred_: modules under a preferred hold)
  std::vector<bool> held_module_, preferred_module_;
  std::vector<module_id> held_list_, preferred_list_;
  // By bytes per element: P, U \ P, and every sharded parameter.
  std::array<std::ptrdiff_t, 9> fixed_numel_{}, free_numel_{}, all_numel_{};
  std::size_t max_numel_ = 0;
};

}  // namespace zshard::plan::detail

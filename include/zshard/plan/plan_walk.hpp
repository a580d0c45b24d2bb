#pragma once
// The planner's walk over a training schedule (plan/schedule.hpp): event by event, in the
// engine's order, it charges a ledger with what the engine and its default policies allocate,
// so the result reads like a run's ledger. Every term but one is replayed exactly, since it
// depends only on the schedule: the HookTracker's counts (track::use_counter itself runs here,
// so a schedule the engine refuses is refused with the same words), full gradients and the
// Reducer's buckets (with no-sync accumulation, plan_options::no_sync), reduce-scatter outputs,
// activations, gather_param staging, step().
//
// The one term that depends on the run is gathered_params: which gathers ahead the engine
// admits (first fit, in request order, while resident elements stay within max_live_numel) and
// which advisory parameters it evicts to make room. The plan bounds it for every admission
// and eviction order, as follows.
//
//   Let U(t) be the parameters resident at point t of a run with an unbounded max_live_numel
//   (every request admitted, nothing evicted); this walk computes U exactly. Claim: the real
//   run's resident set R(t) is a subset of U(t) at every t. By induction over engine events,
//   both runs seeing the same Prefetcher and HookTracker decisions (those depend only on the
//   sequence of scopes, never on residency; trace_mirror.hpp):
//    - a scope opens: both gather its own parameters; R gathers a subset of the requests ahead
//      that U gathers all of; R may also evict (only shrinks R). So R ⊆ U after.
//    - a scope closes / a hold ends: p leaves U iff p is unpinned, unheld (binding or preferred)
//      and not kept by the Prefetcher; pins, holds and keeps are the same in both runs, so p
//      leaves R then too. (A preferred hold, engine/residency.hpp, may also be evicted from R:
//      that only shrinks R.)
//    - end_backward and step release everything unpinned from both.
//   Let P(t) be the pinned (open scopes) and bindingly held (HookTracker keeps_gathered)
//   parameters: P ⊆ R, since both are gathered and never evictable. Preferred holds (the default
//   tracker's recomputed modules, plan_options::keep_gathered_until_backward) are evictable, so
//   they sit in U \ P like the Prefetcher's keeps. The engine keeps |R| ≤ max_live_numel (I5), or R is one
//   oversized module alone (which the walk checks is the case, else the engine would throw).
//   So R = P ∪ A with A ⊆ U \ P and |A| ≤ max_live_numel − |P|, and
//      bytes(R) ≤ bytes(P) + max { bytes(A) : A ⊆ U \ P, |A| ≤ max_live_numel − |P| },
//   which the walk bounds by filling the room with the widest elements of U \ P first (the
//   fractional knapsack, an upper bound of the integral one). Between events R only shrinks
//   (gathers happen in scope openings, whose end state includes every intermediate one), so
//   the figure after each event bounds the run until the next: the plan bounds the run's
//   gathered_params at every moment, for any order of admission and eviction. When
//   max_live_numel does not bind, U = R and the bound is exact.
//
// Every event costs O(parameters it names) and the Prefetcher's window is kept incrementally,
// so a walk is linear in the size of the schedule.
#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/engine/open_scopes.hpp"
#include "zshard/engine/settings_check.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/hybrid_layout.hpp"
#include "zshard/partition/partitioner.hpp"
#include "zshard/plan/offload_terms.hpp"
#include "zshard/plan/plan_result.hpp"
#include "zshard/plan/schedule.hpp"
#include "zshard/plan/trace_mirror.hpp"
#include "zshard/track/use_counter.hpp"

namespace zshard::plan::detail {

class plan_walk {
 public:
  plan_walk(const model_spec& spec, const engine_config& cfg, int world, std::vector<shard_layout> layouts,
            const training_schedule& schedule, const plan_options& opt)
      : spec_(spec),
        cfg_(cfg),
        world_(world),
        hybrid_(hybrid_layout::of(cfg.hybrid, world)),
        layouts_(std::move(layouts)),
        schedule_(schedule),
        opt_(opt),
        mirror_(spec, layouts_, cfg.prefetch, opt.prefetcher == prefetch_policy::trace),
        offload_(spec, cfg, layouts_, opt_) {
    const std::size_t np = spec.params().size(), nm = spec.modules().size();
    for (module_id m = 0; m < nm; ++m) {
      const std::size_t n = mirror_.module_numel()[m];
      ZSHARD_REQUIRE(
          n <= cfg.prefetch.max_live_numel || cfg.prefetch.allow_oversized_module, error_kind::config,
          "module '" + spec.module(m).name + "' needs " + std::to_string(n) +
              " gathered elements, more than max_live_numel = " + std::to_string(cfg.prefetch.max_live_numel),
          "raise max_live_numel, split the module, or set allow_oversized_module");
    }
    resident_.assign(np, false);
    pins_.assign(np, 0);
    holds_.assign(np, 0);
    full_grad_.assign(np, false);
    held_module_.assign(nm, false);
    preferred_module_.assign(nm, false);
    preferred_.assign(np, 0);
    keep_.assign(nm, false);
    for (const auto& name : opt.keep_gathered_until_backward) keep_[spec.module_by_name(name)] = true;
    unsynced_.assign(np, false);
    tracker_.reset(spec);
  }

  memory_plan run() {
    memory_plan out;
    out.world = world_;
    out.shard_group = hybrid_.group_size;
    out.overheads = opt_.overheads;
    constant_terms();
    // Walk steps until the Prefetcher's state at a cycle position repeats: from then on the
    // run repeats what was walked.
    const std::size_t n = schedule_.cycle.size();
    std::vector<bool> seen(n * 3 * (n + 1), false);
    for (std::size_t s = 0;; ++s) {
      const std::size_t at = s % n;
      const std::size_t key =
          (at * 3 + std::size_t(mirror_.current())) * (n + 1) + std::size_t(mirror_.trace_source() + 1);
      if (seen[key]) break;
      seen[key] = true;
      walk_step(int(s), at);
    }
    out.device = result("device");
    out.host = offload_.host();
    out.nvme = offload_.nvme();
    out.host_pinned = opt_.host_pinned;
    out.moved = moved_;
    out.max_gathered_numel = max_gathered_numel_;
    out.steps_simulated = steps_;
    out.traffic = traffic_;
    return out;
  }

 private:
  // Where the ledger's total peaked; the phase text is built once, at the end.
  struct where {
    int step = -1;
    std::size_t program = 0, event = 0;
    int what = 0;  // 0: the event, 1: reduce-scatter of `param`, 2: initialization, 3: step(), 4: end of backward
    param_id param = 0;
  };

  std::size_t elem(param_id p) const { return size_of(spec_.param(p).type.value_or(cfg_.param_dtype)); }
  bool trainable(param_id p) const { return spec_.param(p).trainable; }
  bool sharded(param_id p) const { return !layouts_[p].replicated; }
  const std::vector<param_id>& params(module_id m) const { return spec_.module(m).params; }

  void constant_terms() {
    here_ = {-1, 0, 0, 2, 0};
    std::size_t sharded_bytes = 0, trainable_shards = 0, largest_shard = 0;
    for (param_id p = 0; p < spec_.params().size(); ++p) {
      if (!offload_.offloaded(p)) sharded_bytes += layouts_[p].shard_numel * elem(p);  // else in the host ledger
      largest_shard = std::max(largest_shard, layouts_[p].shard_numel);
      if (trainable(p)) trainable_shards += layouts_[p].shard_numel;
      export_scratch_ = std::max(export_scratch_, gather_scratch(p));
    }
    charge(mem_category::sharded_params, sharded_bytes);
    if (opt_.optimizer == optimizer_location::device) {
      charge(mem_category::optimizer_state, 3 * 4 * trainable_shards);
      charge(mem_category::grad_shards, 4 * trainable_shards);
    }
    if (opt_.initialization) {
      const std::size_t check = exchange_scratch_bytes(schedule_settings(spec_, cfg_, layouts_, world_).size(), world_);
      const std::size_t staging = 4 * largest_shard;
      transient(mem_category::scratch, std::max(check, staging));
    }
  }

  // engine::gather_param: f32 staging of the padded value, and the gathered value beside it.
  // An offloaded shard's upload buffer besides (offload_terms.hpp).
  std::size_t gather_scratch(param_id p) const {
    const auto& l = layouts_[p];
    return 4 * l.padded_numel + (l.replicated ? 0 : l.padded_numel * elem(p)) + offload_.upload_bytes(p);
  }

  void walk_step(int s, std::size_t at) {
    const step_program& prog = schedule_.cycle[at];
    traffic_ = {};
    moved_ = {};
    mirror_.begin_step(int(at));
    micro_batches_left_ = 0;
    for (const auto& e : prog.events) micro_batches_left_ += e.kind == event_kind::end_backward ? 1 : 0;
    for (std::size_t i = 0; i < prog.events.size(); ++i) {
      here_ = {s, at, i, 0, 0};
      try {
        visit(prog.events[i]);
      } catch (const error& e) {
        throw error(e.kind(),
                    "step program '" + prog.name + "' (step " + std::to_string(s + 1) + "), event #" +
                        std::to_string(i) + ": " + e.message(),
                    e.hint());
      }
    }
    here_ = {s, at, prog.events.size(), 3, 0};
    moved_.to_device += offload_.step_working_up();  // host_adam's update (no step skipped)
    moved_.disk_read += offload_.step_disk_bytes();
    moved_.disk_written += offload_.step_disk_bytes();
    tracker_.on_step();
    transient(mem_category::scratch, exchange_scratch_bytes(step_exchange_words, world_));  // ranks agree, grad stats
    traffic_.world += all_gather_bytes(8 * step_exchange_words, world_);
    mirror_.end_step();
    release_unpinned();
    ++steps_;
  }

  void visit(const schedule_event& e) {
    switch (e.kind) {
      case event_kind::open:
        open(e.module, e.scope);
        break;
      case event_kind::close:
        close(e.module, e.scope == scope_kind::backward);
        break;
      case event_kind::begin_backward:
        tracker_.on_begin_backward();
        break;
      case event_kind::end_backward:
        end_backward();
        break;
      case event_kind::activations:
        set(mem_category::activations, e.bytes);
        break;
      case event_kind::gather_param:
        transient(mem_category::scratch, gather_scratch(e.param));
        moved_.to_device += offload_.upload_bytes(e.param);
        if (sharded(e.param)) traffic_.shard_group += all_gather_bytes(layouts_[e.param].shard_numel * elem(e.param), group());
        break;
      case event_kind::export_params:
        transient(mem_category::scratch, export_scratch_);
        for (param_id p = 0; p < spec_.params().size(); ++p) moved_.to_device += offload_.upload_bytes(p);
        break;
    }
  }

  // ---- residency: U (what an unbounded run holds), P (pinned or held) --------------------------
  bool kept_fixed(param_id p) const { return pins_[p] > 0 || holds_[p] > 0; }
  // Adds (+1) or removes (-1) p's share of the sums the bound reads.
  void account(param_id p, int sign) {
    if (!resident_[p]) return;
    const std::size_t n = layouts_[p].padded_numel;
    if (kept_fixed(p)) {
      fixed_numel_ += sign * std::ptrdiff_t(n);
      fixed_bytes_ += sign * std::ptrdiff_t(n * elem(p));
    } else {
      free_numel_[elem(p)] += sign * std::ptrdiff_t(n);
    }
  }
  template <class Change>
  void change(param_id p, Change&& c) {
    account(p, -1);
    c();
    account(p, +1);
  }
  void gather(param_id p) {
    if (!sharded(p) || resident_[p]) return;
    traffic_.shard_group += all_gather_bytes(layouts_[p].shard_numel * elem(p), group());
    uploads_ += offload_.upload_bytes(p);  // the group's upload buffers (offload/param_tier.hpp)
    resident_[p] = true;
    resident_list_.push_back(p);
    account(p, +1);
  }
  void release_if_unused(param_id p) {
    if (!resident_[p] || kept_fixed(p) || mirror_.keep(p) || preferred_[p] > 0) return;
    account(p, -1);
    resident_[p] = false;
  }
  void set_held(module_id m, bool held) {
    if (held_module_[m] == held) return;
    held_module_[m] = held;
    if (held) held_list_.push_back(m);
    for (param_id p : params(m)) {
      change(p, [&] { holds_[p] += held ? 1 : -1; });
      if (!held) release_if_unused(p);
    }
  }

  // A preferred hold (engine/residency.hpp) keeps p resident like the Prefetcher's keep: in the
  // free part of the bound (evictable under max_live_numel), never in the fixed part.
  void set_preferred(module_id m, bool on) {
    if (preferred_module_[m] == on) return;
    preferred_module_[m] = on;
    if (on) preferred_list_.push_back(m);
    for (param_id p : params(m)) {
      preferred_[p] += on ? 1 : -1;
      if (!on) release_if_unused(p);
    }
  }

  // The bound on gathered bytes (see the proof at the top).
  std::size_t gathered_bound() {
    const std::size_t live = cfg_.prefetch.max_live_numel, fixed = std::size_t(fixed_numel_);
    if (fixed >= live) {
      max_gathered_numel_ = std::max(max_gathered_numel_, fixed);
      return std::size_t(fixed_bytes_);
    }
    std::size_t room = live - fixed, bytes = std::size_t(fixed_bytes_);
    for (std::size_t w = free_numel_.size(); w-- > 1 && room > 0;) {
      const std::size_t take = std::min(room, std::size_t(free_numel_[w]));
      bytes += take * w;
      room -= take;
    }
    max_gathered_numel_ = std::max(max_gathered_numel_, live - room);
    return bytes;
  }

  void open(module_id m, scope_kind k) {
    if (k == scope_kind::backward) {
      if (backward_open_.empty()) backward_open_.assign(spec_.modules().size(), 0);
      if (backward_open_[m] != 0) throw_nested_backward(spec_, m);
    }
    if (k == scope_kind::backward)
      tracker_.on_backward(m);
    else
      tracker_.on_forward(m, use_of(k));
    ahead_.clear();
    if (cfg_.check_every_scope) traffic_.world += all_gather_bytes(8 * 2, world_);
    mirror_.enter(m, use_of(k), ahead_);
    uploads_ = 0;
    for (param_id p : params(m)) {
      gather(p);
      change(p, [&] { ++pins_[p]; });
    }
    if (uploads_ > 0) {  // offloaded shards: the own group's upload buffers beside its gathered values
      set(mem_category::gathered_params, gathered_bound());
      uploaded(uploads_);
    }
    uploads_ = 0;
    for (param_id p : ahead_) gather(p);
    const std::size_t fixed = std::size_t(fixed_numel_), own = mirror_.module_numel()[m];
    ZSHARD_REQUIRE(fixed <= cfg_.prefetch.max_live_numel || (cfg_.prefetch.allow_oversized_module && fixed == own),
                   error_kind::budget,
                   "gathering module '" + spec_.module(m).name + "' makes " + std::to_string(fixed) +
                       " elements resident in open or held scopes, above max_live_numel = " +
                       std::to_string(cfg_.prefetch.max_live_numel) + "; the engine would refuse it",
                   "close enclosing scopes sooner, or raise max_live_numel");
    set(mem_category::gathered_params, gathered_bound());
    uploaded(uploads_);  // the group ahead's
    if (k != scope_kind::backward) return;
    ++backward_open_[m];
    for (param_id p : params(m)) {
      if (!trainable(p) || full_grad_[p]) continue;
      full_grad_[p] = true;
      charge(mem_category::grad_buckets, 4 * layouts_[p].padded_numel);
    }
  }

  void close(module_id m, bool backward) {
    if (backward) {
      --backward_open_[m];
      completed_.clear();
      tracker_.on_backward_done(m, completed_);
      for (param_id p : completed_) complete(p);
    }
    set_held(m, tracker_.keeps_gathered(m));
    // engine/training_controls.hpp's prefers_gathered: kept until its backward, or the tracker's
    set_preferred(m, (keep_[m] && tracker_.pending_uses(m) > 0) || tracker_.prefers_gathered(m));
    for (param_id p : params(m)) {
      change(p, [&] { --pins_[p]; });
      release_if_unused(p);
    }
    set(mem_category::gathered_params, gathered_bound());
  }

  // The tracker's sweep and the Reducer's flush run with the gathered set as it was; then
  // holds end and everything unpinned is released (no scope is open here).
  void end_backward() {
    completed_.clear();
    swept_.clear();
    tracker_.on_end_backward(completed_, swept_);
    for (param_id p : completed_) complete(p);
    if (syncing()) {  // engine/grad_sync.hpp's end_backward: what earlier micro-batches held
      for (param_id p : held_grads_)
        if (unsynced_[p]) {
          unsynced_[p] = false;
          grad_ready(p);
        }
      held_grads_.clear();
    }
    --micro_batches_left_;
    here_.what = 4;
    flush();
    for (module_id m : held_list_) set_held(m, false);
    held_list_.clear();
    for (module_id m : preferred_list_) set_preferred(m, false);
    preferred_list_.clear();
    release_unpinned();
  }

  // engine::end_backward and engine::step: no scope is open, so nothing stays gathered.
  void release_unpinned() {
    for (param_id p : resident_list_)
      if (resident_[p]) {
        account(p, -1);
        resident_[p] = false;
      }
    resident_list_.clear();
    set(mem_category::gathered_params, gathered_bound());
  }

  // engine/grad_sync.hpp, replayed: with plan_options::no_sync every micro-batch of a step but
  // the last holds its completed gradients (full, unreduced) for the next.
  bool syncing() const { return !opt_.no_sync || micro_batches_left_ <= 1; }
  void complete(param_id p) {
    if (!syncing()) {
      if (!unsynced_[p]) held_grads_.push_back(p);
      unsynced_[p] = true;
      return;
    }
    unsynced_[p] = false;
    grad_ready(p);
  }

  // reduce::bucketed, replayed exactly (packs of small replicated gradients included).
  void grad_ready(param_id p) {
    if (!full_grad_[p]) return;  // no backward wrote to it this micro-batch
    const std::size_t n = layouts_[p].padded_numel;
    if (!pending_.empty() && pending_numel_ + n > cfg_.reduce.reduce_bucket_numel) flush();
    pending_.push_back(p);
    pending_numel_ += n;
    if (pending_numel_ >= cfg_.reduce.reduce_bucket_numel) flush();
  }
  // Replicated gradients of at most replicated_pack_numel elements first, packed in order into
  // staging buffers of at most that many elements (each charged whole, its gradients freed as
  // copied, freed after its all-reduce; a pack of one is all-reduced in place), then the rest in
  // order.
  bool packable(param_id p) const {
    return !sharded(p) && full_grad_[p] && layouts_[p].numel <= cfg_.reduce.replicated_pack_numel;
  }
  void reduce_pack(std::size_t begin, std::size_t end, std::size_t numel, std::size_t count) {
    if (count > 1) charge(mem_category::grad_buckets, 4 * numel);
    // one all-reduce of the pack in the group (a pack of one: the parameter's own), then each
    // member's across replica groups (reduce/replica_sink.hpp)
    if (count > 1) traffic_.shard_group += all_reduce_bytes(4 * numel, group());
    for (std::size_t i = begin, packed = 0; i < end && packed < count; ++i) {
      const param_id p = pending_[i];
      if (!packable(p)) continue;
      if (count > 1 && !hybrid_.flat()) traffic_.across_groups += all_reduce_bytes(4 * layouts_[p].numel, hybrid_.replicas);
      if (count == 1) reduce_traffic(p);
      moved_.to_host += offload_.grad_down_bytes(p);
      here_.what = 1;
      here_.param = p;
      ledger_.release(mem_category::grad_buckets, 4 * layouts_[p].padded_numel);
      full_grad_[p] = false;
      ++packed;
    }
    if (count > 1) ledger_.release(mem_category::grad_buckets, 4 * numel);
  }
  void flush() {
    const int what = here_.what;
    std::size_t begin = 0, numel = 0, count = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      if (!packable(pending_[i])) continue;
      const std::size_t n = layouts_[pending_[i]].numel;
      if (count > 0 && numel + n > cfg_.reduce.replicated_pack_numel) {
        here_.what = 1;
        here_.param = pending_[begin];
        reduce_pack(begin, i, numel, count);
        numel = count = 0;
      }
      if (count == 0) begin = i;
      numel += n;
      ++count;
    }
    if (count > 0) {
      here_.what = 1;
      here_.param = pending_[begin];
      reduce_pack(begin, pending_.size(), numel, count);
    }
    for (param_id p : pending_) {
      if (!full_grad_[p]) continue;  // packed above
      here_.what = 1;
      here_.param = p;
      if (sharded(p))
        transient(mem_category::scratch, 4 * layouts_[p].shard_numel);  // replicated: all-reduced in place
      reduce_traffic(p);
      moved_.to_host += offload_.grad_down_bytes(p);
      ledger_.release(mem_category::grad_buckets, 4 * layouts_[p].padded_numel);
      full_grad_[p] = false;
    }
    here_.what = what;
    pending_.clear();
    pending_numel_ = 0;
  }

  // A gather group's upload buffers, freed once the group is issued.
  void uploaded(std::size_t bytes) {
    if (bytes == 0) return;
    transient(mem_category::scratch, bytes);
    moved_.to_device += bytes;
  }

  // ---- communication (as null_comm counts it) ---------------------------------------------------
  int group() const noexcept { return hybrid_.group_size; }
  static std::uint64_t all_gather_bytes(std::size_t block, int n) { return std::uint64_t(block) * std::uint64_t(n - 1); }
  static std::uint64_t all_reduce_bytes(std::size_t bytes, int n) {
    return n > 1 ? 2 * std::uint64_t(bytes) * std::uint64_t(n - 1) / std::uint64_t(n) : 0;
  }
  // The Reducer's reduce-scatter (all-reduce when replicated) in the group, then the all-reduce
  // of the result across replica groups (reduce/replica_sink.hpp).
  void reduce_traffic(param_id p) {
    const auto& l = layouts_[p];
    const std::size_t out = 4 * (l.replicated ? l.numel : l.shard_numel);
    traffic_.shard_group += l.replicated ? all_reduce_bytes(out, group()) : all_gather_bytes(out, group());
    if (!hybrid_.flat()) traffic_.across_groups += all_reduce_bytes(out, hybrid_.replicas);
  }

  // ---- the ledger ----------------------------------------------------------------------------
  void charge(mem_category c, std::size_t bytes) {
    ledger_.charge(c, bytes);
    if (ledger_.total_peak() > peak_seen_) {
      peak_seen_ = ledger_.total_peak();
      peak_at_ = here_;
    }
  }
  void transient(mem_category c, std::size_t bytes) {
    charge(c, bytes);
    ledger_.release(c, bytes);
  }
  void set(mem_category c, std::size_t bytes) {
    const std::size_t now = ledger_.current(c);
    if (bytes > now)
      charge(c, bytes - now);
    else
      ledger_.release(c, now - bytes);
  }

  std::string describe(const where& w) const {
    if (w.what == 2) return "initialization";
    const step_program& prog = schedule_.cycle[w.program];
    std::string s = "step " + std::to_string(w.step + 1) +
                    (schedule_.cycle.size() > 1 ? " ('" + prog.name + "')" : std::string()) + ": ";
    if (w.what == 3) return s + "step()";
    if (w.event < prog.events.size()) {
      const auto& e = prog.events[w.event];
      if (e.kind == event_kind::open || e.kind == event_kind::close)
        s += std::string(e.kind == event_kind::open ? "" : "closing ") + to_string(e.scope) + " of " +
             spec_.module(e.module).name;
      else if (e.kind == event_kind::end_backward)
        s += "end of backward";
      else if (e.kind == event_kind::activations)
        s += "activations";
      else if (e.kind == event_kind::gather_param)
        s += "gather_param(" + spec_.param(e.param).name + ")";
      else if (e.kind == event_kind::export_params)
        s += "export";
    }
    if (w.what == 1) s += ": reduce-scatter of " + spec_.param(w.param).name;
    return s;
  }

  ledger_plan result(const std::string& name) const {
    ledger_plan r;
    r.name = name;
    for (std::size_t i = 0; i < mem_category_count; ++i) {
      r.peak[i] = ledger_.peak(mem_category(i));
      r.at_total_peak[i] = ledger_.at_total_peak(mem_category(i));
    }
    r.total_peak = ledger_.total_peak();
    r.peak_phase = describe(peak_at_);
    return r;
  }

  const model_spec& spec_;
  const engine_config& cfg_;
  const int world_;
  const hybrid_layout hybrid_;
  const std::vector<shard_layout> layouts_;
  const training_schedule& schedule_;
  const plan_options opt_;
  trace_mirror mirror_;
  offload_terms offload_;  // the tiers beyond the device (after layouts_ and opt_, which it reads)
  track::use_counter tracker_;
  std::vector<bool> resident_;  // U: resident in a run with an unbounded max_live_numel
  std::vector<param_id> resident_list_;
  std::vector<int> pins_, holds_;
  std::vector<bool> held_module_;
  std::vector<module_id> held_list_;
  std::vector<bool> preferred_module_;
  std::vector<module_id> preferred_list_;
  std::vector<int> preferred_;  // per parameter: modules under a preferred hold that list it
  std::vector<bool> keep_;      // per module: plan_options::keep_gathered_until_backward
  std::vector<bool> unsynced_;  // per parameter: a full gradient held by a no-sync micro-batch
  std::vector<param_id> held_grads_;
  int micro_batches_left_ = 0;  // in the step program being walked, this one included
  std::ptrdiff_t fixed_numel_ = 0, fixed_bytes_ = 0;  // P: pinned or held
  std::array<std::ptrdiff_t, 9> free_numel_{};        // U \ P, by bytes per element
  std::vector<param_id> ahead_, completed_, pending_;
  std::vector<swept_use> swept_;
  std::vector<bool> full_grad_;
  std::size_t pending_numel_ = 0, export_scratch_ = 0, max_gathered_numel_ = 0;
  std::vector<int> backward_open_;  // open backward scopes per module (nested ones are refused)
  memory_ledger ledger_{"device (plan)"};
  where here_{}, peak_at_{};
  step_traffic traffic_{};
  tier_traffic moved_{};
  std::size_t uploads_ = 0;  // the upload buffers of the gather group being walked
  std::size_t peak_seen_ = 0;
  int steps_ = 0;
};

}  // namespace zshard::plan::detail

#pragma once
// The planner's walk over a training schedule (plan/schedule.hpp): event by event, in the
// engine's order, it charges a ledger with what the engine and its default policies allocate,
// so the result reads like a run's ledger. Every term but one is replayed exactly, since it
// depends only on the schedule: the HookTracker's counts (track::use_counter itself runs here,
// so a schedule the engine refuses is refused with the same words), full gradients and the
// Reducer's buckets (with no-sync accumulation, plan_options::no_sync), reduce-scatter outputs,
// activations, gather_param staging, step().
//
// The one term that depends on the run is gathered_params: plan/gathered_bound.hpp bounds it
// for every order in which the engine admits gathers ahead and evicts (the proof is there).
// Besides the schedule, plan_options says what the run calls between micro-batches and steps
// (keep-gathered modules, no-sync accumulation, unfreezing): their argument exchanges are
// charged wherever the engine allows those calls, and the trainable set this walk replays is
// the caller's (plan/trainable_stages.hpp walks each set the run goes through).
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
#include "zshard/plan/gathered_bound.hpp"
#include "zshard/plan/offload_terms.hpp"
#include "zshard/plan/plan_result.hpp"
#include "zshard/plan/schedule.hpp"
#include "zshard/plan/trace_mirror.hpp"
#include "zshard/plan/walk_ledger.hpp"
#include "zshard/plan/walk_point_name.hpp"
#include "zshard/track/use_counter.hpp"

namespace zshard::plan::detail {

class plan_walk {
 public:
  // `trainable`: the trainable set this walk replays; `has_state`: the parameters whose
  // optimizer state (and gradient shard) exists during the run, unfrozen later ones included.
  plan_walk(const model_spec& spec, const engine_config& cfg, int world, const std::vector<shard_layout>& layouts,
            const training_schedule& schedule, const plan_options& opt, std::vector<bool> trainable,
            std::vector<bool> has_state)
      : spec_(with_trainable(spec, trainable)),
        cfg_(cfg),
        world_(world),
        hybrid_(hybrid_layout::of(cfg.hybrid, world)),
        layouts_(layouts),
        schedule_(schedule),
        opt_(opt),
        has_state_(std::move(has_state)),
        mirror_(spec_, layouts_, cfg.prefetch, opt.prefetcher == prefetch_policy::trace),
        gathered_(spec_, layouts_, cfg.param_dtype, cfg.prefetch.max_live_numel, opt.prefetcher == prefetch_policy::any),
        offload_(spec_, cfg, layouts_, opt_, has_state_) {
    const std::size_t np = spec.params().size(), nm = spec.modules().size();
    for (module_id m = 0; m < nm; ++m) {
      const std::size_t n = mirror_.module_numel()[m];
      ZSHARD_REQUIRE(
          n <= cfg.prefetch.max_live_numel || cfg.prefetch.allow_oversized_module, error_kind::config,
          "module '" + spec.module(m).name + "' needs " + std::to_string(n) +
              " gathered elements, more than max_live_numel = " + std::to_string(cfg.prefetch.max_live_numel),
          "raise max_live_numel, split the module, or set allow_oversized_module");
    }
    full_grad_.assign(np, false);
    keep_.assign(nm, false);
    for (const auto& name : opt.keep_gathered_until_backward) keep_[spec.module_by_name(name)] = true;
    unsynced_.assign(np, false);
    tracker_.reset(spec_);  // reads the trainable flags of this walk's set
    bool unfreezes = false;  // some parameter frozen at registration gets its state later
    for (param_id p = 0; p < np; ++p) unfreezes = unfreezes || (has_state_[p] && !spec.param(p).trainable);
    between_step_controls_ = !opt.keep_gathered_until_backward.empty() || unfreezes;
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
    out.device = ledger_.result("device", [this](const where& w) { return describe(w); });
    out.host = offload_.host();
    out.nvme = offload_.nvme();
    out.host_pinned = opt_.host_pinned;
    out.moved = moved_;
    out.max_gathered_numel = gathered_.max_numel();
    out.steps_simulated = steps_;
    out.traffic = traffic_;
    return out;
  }

 private:
  using where = walk_point;

  std::size_t elem(param_id p) const { return size_of(spec_.param(p).type.value_or(cfg_.param_dtype)); }
  bool trainable(param_id p) const { return spec_.param(p).trainable; }
  // The model as this walk's trainable set has it (the HookTracker reads the flags, as the
  // engine's does after set_trainable).
  static model_spec with_trainable(const model_spec& spec, const std::vector<bool>& trainable) {
    model_spec s = spec;
    for (param_id p = 0; p < s.params().size(); ++p) s.set_trainable(p, trainable[p]);
    return s;
  }
  bool sharded(param_id p) const { return !layouts_[p].replicated; }
  const std::vector<param_id>& params(module_id m) const { return spec_.module(m).params; }

  void constant_terms() {
    here_ = {-1, 0, 0, 2, 0};
    std::size_t sharded_bytes = 0, trainable_shards = 0, largest_shard = 0;
    for (param_id p = 0; p < spec_.params().size(); ++p) {
      if (!offload_.offloaded(p)) sharded_bytes += layouts_[p].shard_numel * elem(p);  // else in the host ledger
      largest_shard = std::max(largest_shard, layouts_[p].shard_numel);
      if (has_state_[p]) trainable_shards += layouts_[p].shard_numel;
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
    backwards_done_ = 0;
    here_ = {s, at, std::size_t(-1), 0, 0};
    control_point();
    for (std::size_t i = 0; i < prog.events.size(); ++i) {
      here_ = {s, at, i, 0, 0};
      try {
        visit(prog.events[i]);
        control_point();
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

  // The engine's calls whose arguments every rank checks in one exchange of a few words
  // (rank_agreement::same_arguments, argument_check_words): set_gradient_sync (one argument, the
  // flag) between micro-batches with plan_options::no_sync; set_keep_gathered_until_backward and
  // set_trainable (two) between steps, with keep-gathered modules or parameters unfrozen later.
  // The run may make them wherever the engine allows: no scope open, outside backward, no
  // counted forward awaiting its backward (and for the between-step ones, no backward yet in
  // this step). Each such point is charged the exchange's scratch over what is held there.
  void control_point() {
    if (depth_ != 0 || in_backward_ || counted_pending_) return;
    std::size_t words = opt_.no_sync ? argument_check_words(1) : 0;
    if (between_step_controls_ && backwards_done_ == 0) words = argument_check_words(2);
    if (words == 0) return;
    const int what = here_.what;
    here_.what = 5;
    transient(mem_category::scratch, exchange_scratch_bytes(words, world_));
    here_.what = what;
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
        in_backward_ = true;
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

  // ---- residency: the bound of plan/gathered_bound.hpp, fed with the Prefetcher's decisions ----
  void gather(param_id p) {
    if (!gathered_.gather(p)) return;
    traffic_.shard_group += all_gather_bytes(layouts_[p].shard_numel * elem(p), group());
    uploads_ += offload_.upload_bytes(p);  // the group's upload buffers (offload/param_tier.hpp)
  }
  auto prefetcher_keeps() {
    return [this](param_id p) { return mirror_.keep(p); };
  }
  void update_gathered() { set(mem_category::gathered_params, gathered_.bytes()); }

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
    if (cfg_.check_every_scope) {  // rank_agreement::at_scope, before the scope's gathers
      transient(mem_category::scratch, exchange_scratch_bytes(2, world_));
      traffic_.world += all_gather_bytes(8 * 2, world_);
    }
    ++depth_;
    counted_pending_ = counted_pending_ || k == scope_kind::forward;
    mirror_.enter(m, use_of(k), ahead_);
    gathered_.scope_opened();
    uploads_ = 0;
    for (param_id p : params(m)) {
      gather(p);
      gathered_.pin(p, +1);
    }
    if (uploads_ > 0) {  // offloaded shards: the own group's upload buffers beside its gathered values
      update_gathered();
      uploaded(uploads_);
    }
    uploads_ = 0;
    for (param_id p : ahead_) gather(p);
    const std::size_t fixed = gathered_.fixed_numel(), own = mirror_.module_numel()[m];
    ZSHARD_REQUIRE(fixed <= cfg_.prefetch.max_live_numel || (cfg_.prefetch.allow_oversized_module && fixed == own),
                   error_kind::budget,
                   "gathering module '" + spec_.module(m).name + "' makes " + std::to_string(fixed) +
                       " elements resident in open or held scopes, above max_live_numel = " +
                       std::to_string(cfg_.prefetch.max_live_numel) + "; the engine would refuse it",
                   "close enclosing scopes sooner, or raise max_live_numel");
    update_gathered();
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
    --depth_;
    gathered_.hold(m, tracker_.keeps_gathered(m), prefetcher_keeps());
    // engine/training_controls.hpp's prefers_gathered: kept until its backward, or the tracker's
    gathered_.prefer(m, (keep_[m] && tracker_.pending_uses(m) > 0) || tracker_.prefers_gathered(m),
                     prefetcher_keeps());
    for (param_id p : params(m)) {
      gathered_.pin(p, -1);
      gathered_.release_if_unused(p, [&] { return mirror_.keep(p); });
    }
    update_gathered();
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
    ++backwards_done_;
    in_backward_ = counted_pending_ = false;
    here_.what = 4;
    flush();
    gathered_.end_holds(prefetcher_keeps());
    release_unpinned();
  }

  // engine::end_backward and engine::step: no scope is open, so nothing stays gathered.
  void release_unpinned() {
    gathered_.release_all();
    update_gathered();
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

  // ---- the ledger (plan/walk_ledger.hpp), at the walk's point ------------------------------------
  void charge(mem_category c, std::size_t bytes) { ledger_.charge(c, bytes, here_); }
  void transient(mem_category c, std::size_t bytes) { ledger_.transient(c, bytes, here_); }
  void set(mem_category c, std::size_t bytes) { ledger_.set(c, bytes, here_); }

  std::string describe(const where& w) const { return describe_walk_point(w, schedule_, spec_); }

  const model_spec spec_;  // with this walk's trainable set
  const engine_config& cfg_;
  const int world_;
  const hybrid_layout hybrid_;
  const std::vector<shard_layout>& layouts_;
  const training_schedule& schedule_;
  const plan_options& opt_;
  const std::vector<bool> has_state_;  // per parameter (see the constructor)
  trace_mirror mirror_;
  gathered_bound gathered_;
  offload_terms offload_;  // the tiers beyond the device (after layouts_, opt_ and has_state_, which it reads)
  track::use_counter tracker_;
  std::vector<bool> keep_;      // per module: plan_options::keep_gathered_until_backward
  std::vector<bool> unsynced_;  // per parameter: a full gradient held by a no-sync micro-batch
  std::vector<param_id> held_grads_;
  int micro_batches_left_ = 0;  // in the step program being walked, this one included
  // Where the engine's control calls may come (control_point).
  int depth_ = 0, backwards_done_ = 0;  // open scopes; end_backward()s in this step so far
  bool in_backward_ = false, counted_pending_ = false, between_step_controls_ = false;
  std::vector<param_id> ahead_, completed_, pending_;
  std::vector<swept_use> swept_;
  std::vector<bool> full_grad_;
  std::size_t pending_numel_ = 0, export_scratch_ = 0;
  std::vector<int> backward_open_;  // open backward scopes per module (nested ones are refused)
  walk_ledger ledger_;
  where here_{};
  step_traffic traffic_{};
  tier_traffic moved_{};
  std::size_t uploads_ = 0;  // the upload buffers of the gather group being walked
  int steps_ = 0;
};

}  // namespace zshard::plan::detail

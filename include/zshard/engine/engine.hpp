#pragma once
// The ZeRO-3 engine: composes a Backend, a Communicator and five policies into the scopes a
// training stack calls (see README and DESIGN.md):
//
//   for each micro-batch:
//     forward(m) per module, begin_backward(), [recompute(m)] + backward(m) per module in
//     reverse, end_backward()
//   step()
// and for a forward-only pass (inference, generation, a frozen reference model):
//   forward(m, use_kind::no_grad) per module, end_pass()
//
// The engine owns the sequencing and the checks that bind the policies together; each policy
// owns one decision (layout, what to keep gathered, when to reduce, where the optimizer runs,
// which uses count). One engine per rank, used from that rank's thread.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zshard/backend/backend.hpp"
#include "zshard/comm/communicator.hpp"
#include "zshard/engine/comm_watch.hpp"
#include "zshard/engine/default_policies.hpp"
#include "zshard/engine/engine_checks.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/engine/full_state.hpp"
#include "zshard/engine/grad_norm.hpp"
#include "zshard/engine/hybrid_groups.hpp"
#include "zshard/engine/module_scope.hpp"
#include "zshard/engine/open_scopes.hpp"
#include "zshard/engine/rank_agreement.hpp"
#include "zshard/engine/schedule_fingerprint.hpp"
#include "zshard/engine/settings_check.hpp"
#include "zshard/engine/shard_state.hpp"
#include "zshard/engine/residency.hpp"
#include "zshard/engine/step_report.hpp"
#include "zshard/engine/training_controls.hpp"
#include "zshard/offload/host_memory.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/optim/grad_clip.hpp"
#include "zshard/optim/loss_scaler.hpp"
#include "zshard/prefetch/prefetcher.hpp"
#include "zshard/reduce/reducer.hpp"
#include "zshard/reduce/replica_sink.hpp"
#include "zshard/state/param_store.hpp"
#include "zshard/state/state_access.hpp"
#include "zshard/trace/trace_sink.hpp"
#include "zshard/track/hook_tracker.hpp"

namespace zshard {

// The template parameters are checked first, each by its own check_*() with a message that says
// what is missing and how to fix it; they are not constrained in the template head, where a
// failure would read as a raw "constraints not satisfied".
template <class Backend, class Comm, class Policies = default_policies>
class engine {
  static_assert(check_backend<Backend>());
  static_assert(check_communicator<Comm>());
  static_assert(check_policies<Policies>());
  static_assert(check_partitioner<typename Policies::partitioner, Backend, Comm>());
  static_assert(check_prefetcher<typename Policies::prefetcher, Backend, Comm>());
  static_assert(check_hook_tracker<typename Policies::hook_tracker, Backend, Comm>());
  static_assert(check_offloader<typename Policies::offloader, Backend, Comm>());
  static_assert(check_reducer<typename Policies::reducer, Backend, Comm,
                              reduce::replica_sink<Backend, Comm, policy_impl_t<typename Policies::offloader, Backend, Comm>>>());

 public:
  using backend_type = Backend;
  using comm_type = Comm;
  using stream_type = typename Backend::stream;
  using partitioner_type = policy_impl_t<typename Policies::partitioner, Backend, Comm>;
  using prefetcher_type = policy_impl_t<typename Policies::prefetcher, Backend, Comm>;
  using tracker_type = policy_impl_t<typename Policies::hook_tracker, Backend, Comm>;
  using offloader_type = policy_impl_t<typename Policies::offloader, Backend, Comm>;
  using reducer_type = policy_impl_t<typename Policies::reducer, Backend, Comm>;
  using scope = module_scope<engine>;
  using sink_type = reduce::replica_sink<Backend, Comm, offloader_type>;

  // `compute`: the training stack's compute stream, when it brings its own; the engine's work
  // that the stack's kernels read or write (and gathers and reductions, through events) is
  // ordered on it. Default: the backend's compute stream.
  engine(Backend& backend, Comm& comm, model_spec spec, engine_config cfg,
         std::optional<stream_type> compute = std::nullopt)
      : engine(backend, comm, comm, std::move(spec), std::move(cfg), std::move(compute)) {}
  // With a second communicator over the same ranks for gradient reductions (the Reducer's
  // reduce-scatters and all-reduces): NCCL runs one communicator's collectives in issue order
  // whatever their streams, so on one communicator a gather waits for the reduction issued
  // before it, which waits for backward. On their own communicator, reductions run beside the
  // gathers, ordered only by the role streams (state/stream_roles.hpp). `reduce_comm` may be
  // `comm` itself (the default above); it must have comm's rank and size, and every rank must
  // make the same choice. Build it with ncclCommSplit or a second communicator of the world.
  // With NCCL, set NCCL_LAUNCH_ORDER_IMPLICIT=1 when two communicators per GPU are in flight.
  //
  // With hybrid sharding (engine_config::hybrid) both are the world's communicators: the engine
  // splits them into shard groups and replica groups at construction (engine/hybrid_groups.hpp)
  // and comm() / reduce_comm() are then the shard group's.
  engine(Backend& backend, Comm& comm, Comm& reduce_comm, model_spec spec, engine_config cfg,
         std::optional<stream_type> compute = std::nullopt)
      : backend_(backend),
        spec_(validated(std::move(spec))),
        cfg_(validated(std::move(cfg), comm.rank())),
        trace_(start_trace(backend, cfg_, comm.rank())),
        hybrid_(hybrid_layout::of(cfg_.hybrid, comm.size())),
        layouts_(engine_checks::make_layouts(partitioner_, spec_, cfg_, hybrid_.group_size)),
        groups_(backend, comm, checked_reduce_comm(comm, reduce_comm), hybrid_, cfg_.hybrid,
                schedule_settings(spec_, cfg_, layouts_, comm.size())),
        comm_(groups_.shard()),
        reduce_comm_(groups_.reduce_shard()),
        watch_(backend, comm_, reduce_comm_, groups_.replica(), hybrid_.flat() ? nullptr : &groups_.world()),
        store_(backend, spec_, layouts_, cfg_.param_dtype, cfg_.overlap, compute ? &*compute : nullptr,
               cfg_.offload.params != offload_tier::device),
        offloader_(store_, comm_, cfg_.adamw, cfg_.offload),
        sink_(offloader_, groups_.replica(), store_),
        reducer_(store_, reduce_comm_, cfg_.reduce),
        residency_(store_, comm_, prefetcher_, cfg_.prefetch),
        agreement_(backend, comm, store_.streams(), spec_),
        scaler_(cfg_.loss_scale),
        ctl_(spec_, cfg_.param_groups, cfg_.adamw) {
    controls::check_supported(cfg_);
    engine_checks::shard_tier_attached(store_);
    // (a hybrid engine's ranks checked them over the world before splitting)
    if constexpr (Backend::holds_storage)
      if (hybrid_.flat()) agreement_.check_settings(schedule_settings(spec_, cfg_, layouts_, comm_.size()));
    engine_checks::module_sizes(spec_, residency_, cfg_);
    scopes_.reset(spec_.modules().size());
    tracker_.reset(spec_);
    prefetcher_.reset(spec_, layouts_, cfg_.prefetch, cfg_.log);
    initialize_parameters();
    publish_shards();
    completed_.reserve(spec_.params().size());
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  // Waits for work still queued on the role streams (a gather ahead, say), so that no buffer
  // is freed under it. Never throws. Destroyed while an exception unwinds, or broken, the engine
  // aborts its communicators first where they can abort (NCCL): its peers may be waiting for
  // collectives it will never issue, and its own queued collectives for theirs; waiting would
  // hang. Scopes still open are detached (using one afterwards is a usage error) and reported on
  // the log: destroying the engine first is a bug in the training loop.
  ~engine() {
    const bool failing = std::uncaught_exceptions() > uncaught_at_construction_ || broken_;
    if (failing) watch_.abort_all("an engine was destroyed while an exception was in flight");
    if (scopes_.count() > 0) {
      const std::string names = scopes_.orphan_all(spec_);
      try {
        cfg_.say("engine destroyed with module scope(s) " + names + " still open; they are detached");
      } catch (...) {
      }
    }
    try {
      store_.streams().synchronize_all();
    } catch (...) {
      // already failed (a collective timed out, a device error): the backend reports it again
    }
    try {
      if (activation_bytes_) backend_.ledger().release(mem_category::activations, activation_bytes_);
    } catch (...) {
    }
    if (trace_) trace_->unwatch();
  }

  // ---- the scopes ----------------------------------------------------------------------------
  // A forward use of m; `counted` unless grad mode is off for this pass (use_kind::no_grad).
  scope forward(module_id m, use_kind kind = use_kind::counted) {
    ZSHARD_REQUIRE(kind != use_kind::recompute, error_kind::usage, "use recompute(m) for a checkpointed re-run");
    enter_scope(m, kind, false);
    return scope(this, m, false);  // registers itself where it lives (guaranteed elision: no move)
  }
  // Re-runs a checkpointed module's forward during backward: gathers, never counts (I1).
  scope recompute(module_id m) {
    enter_scope(m, use_kind::recompute, false);
    return scope(this, m, false);
  }
  // m's backward: parameters gathered, gradient buffers to accumulate into.
  scope backward(module_id m) {
    enter_scope(m, use_kind::counted, true);
    return scope(this, m, true);
  }

  void begin_backward() {
    rethrow_if_unusable();
    ZSHARD_REQUIRE(scopes_.count() == 0, error_kind::usage,
                   "begin_backward() with " + std::to_string(scopes_.count()) + " module scope(s) still open",
                   "a scope lives as long as its object: end each forward scope before begin_backward(), e.g. "
                   "`{ auto g = eng.forward(m); ... }` (a scope kept in a variable of the loop body stays open)");
    tracker_.on_begin_backward();
    fp_.on_event(schedule_event::begin_backward);
  }

  // Ends a micro-batch's backward: sweeps uses whose backward never ran (I3), flushes the
  // Reducer and releases every non-persistent gathered parameter.
  void end_backward() {
    rethrow_if_unusable();
    ZSHARD_REQUIRE(scopes_.count() == 0, error_kind::usage,
                   "end_backward() with " + std::to_string(scopes_.count()) + " module scope(s) still open",
                   "a scope lives as long as its object: end each backward scope before end_backward(), e.g. "
                   "`{ auto g = eng.backward(m); ... }`");
    completed_.clear();
    const std::size_t swept_before = swept_.size();
    tracker_.on_end_backward(completed_, swept_);
    fp_.on_event(schedule_event::end_backward);
    log_swept(swept_before);
    {
      trace_span t(trace_, "reduce", "reduce-scatter (end of backward)");
      for (param_id p : completed_) ctl_.sync.complete(p, reduce_);
      ctl_.sync.end_backward(reduce_);  // gradients held by no-sync micro-batches, when sync is on again
      reducer_.flush(sink_);
    }
    engine_checks::no_full_gradient_left(store_, [&](param_id p) { return ctl_.sync.held(p); });  // I7
    trace_span t(trace_, "release", "release (end of backward)");
    residency_.end_holds();  // I3: holds end here
    check(residency_.resident_by_scan() == store_.resident_numel(),
          "resident elements disagree with the gathered set (I5)");
    residency_.release_unpinned();
    check(store_.gathered_set().empty(), "parameters still gathered after end_backward");
    ++micro_batches_;
  }

  // The optimizer step over all micro-batches since the last one: global gradient norm and
  // overflow check, clipping, AdamW, new working shards. Every rank decides identically.
  step_report step() {
    rethrow_if_unusable();
    ZSHARD_REQUIRE(scopes_.count() == 0, error_kind::usage, "step() with module scopes still open");
    tracker_.on_step();
    ZSHARD_REQUIRE(micro_batches_ > 0, error_kind::usage, "step() without a backward since the last step",
                   "run at least one forward/begin_backward/backward/end_backward before step(); end a "
                   "forward-only pass with end_pass()");
    ZSHARD_REQUIRE(!ctl_.sync.holding(), error_kind::usage,
                   "step() with " + std::to_string(ctl_.sync.held_count()) + " gradient(s) held unreduced (sync off)",
                   "run the last micro-batch before step() with set_gradient_sync(true)");
    step_report r;
    r.micro_batches = micro_batches_;
    r.swept = std::move(swept_);
    swept_.clear();

    store_.streams().order(stream_role::compute, stream_role::reduce);  // the Offloader reads gradient shards
    fp_.on_event(schedule_event::step);
    // Before anything is applied: ranks whose schedules or learning rates differ fail here, on
    // every rank (I9).
    global_grad_stats g;
    try {
      local_grad_norm local;
      {
        trace_span t(trace_, "optimizer", "gradient statistics (this rank's sums; waits for backward)");
        local = counted_grad_norm();
      }
      trace_span t(trace_, "wait", "gradient statistics exchange (waits for every rank)");
      g = agreement_.at_step(local, fp_, ctl_.groups, step_ + 1);
    } catch (...) {
      offloader_.discard_grads();
      broken_ = std::current_exception();
      throw;
    }
    fp_.start_step();
    const auto [norm, overflow] = g;
    const double denom = double(micro_batches_) * double(scaler_.scale());
    r.grad_norm = norm / denom;
    if (overflow) {
      r.skipped = true;
      r.grad_norm = INFINITY;
      offloader_.discard_grads();
    } else {
      r.clip_coefficient = optim::clip_coefficient(r.grad_norm, cfg_.clip_norm);
      trace_span t(trace_, "optimizer", "optimizer (AdamW, host copies)");
      offloader_.update({step_ + 1, lr(), static_cast<float>(r.clip_coefficient / denom), &ctl_.groups});
      ++step_;  // only once applied: a failed update (an NVMe I/O error) leaves the last completed step's count
    }
    publish_shards();
    scaler_.update(overflow);
    r.step = step_;
    r.loss_scale = scaler_.scale();
    micro_batches_ = 0;
    ctl_.scopes_since_boundary = 0;
    prefetcher_.on_step();
    trace_span t(trace_, "release", "release (step)");
    residency_.release_unpinned();
    check(store_.gathered_set().empty() && reducer_.pending_numel() == 0, "step boundary is not clean (I4)");
    check(residency_.resident_by_scan() == store_.resident_numel(),
          "resident elements disagree with the gathered set (I5)");
    return r;
  }

  // ---- forward-only passes and what changes between steps (engine/training_controls.hpp) ------
  // end_pass(): the boundary of a forward-only pass (use_kind::no_grad forwards only).
  void end_pass() { controls::end_pass(*this); }
  std::int64_t passes() const noexcept { return ctl_.passes; }
  // Collective (every rank, same arguments; checked): freeze / unfreeze p between steps.
  void set_trainable(param_id p, bool trainable) { controls::set_trainable(*this, p, trainable); }
  // Collective: sync off keeps full gradients unreduced across micro-batches (engine/grad_sync.hpp).
  void set_gradient_sync(bool on) { controls::set_gradient_sync(*this, on); }
  bool gradient_sync() const noexcept { return ctl_.sync.enabled(); }
  bool gradient_sync_was_off() const noexcept { return ctl_.sync.ever_off(); }
  // Collective: m stays gathered from its counted forward to its backward (a preferred hold).
  void set_keep_gathered_until_backward(module_id m, bool keep) {
    controls::set_keep_gathered_until_backward(*this, m, keep);
  }

  // The training stack owns activations; it reports how many bytes it holds now so that the
  // ledger's peak (and its budget) covers them too. Call it whenever the figure changes.
  void report_activations(std::size_t bytes) {
    rethrow_if_broken();
    memory_ledger& l = backend_.ledger();
    if (bytes > activation_bytes_)
      l.charge(mem_category::activations, bytes - activation_bytes_);
    else
      l.release(mem_category::activations, activation_bytes_ - bytes);
    activation_bytes_ = bytes;
  }

  // ---- queries -------------------------------------------------------------------------------
  // Multiply the loss gradient by this before backward (1 unless f16 loss scaling is on).
  float loss_scale() const noexcept { return scaler_.scale(); }
  // Learning rates per parameter group (optim/param_groups.hpp): group "default" is index 0. A
  // schedule calls set_lr on every rank alike; the next step() checks that the ranks agree (in
  // its one exchange) and fails on every rank, naming each group and every rank's rate, if not.
  float lr() const noexcept { return ctl_.groups.lr(0); }
  float lr(std::string_view group) const { return ctl_.groups.lr(ctl_.groups.index_of(group)); }
  void set_lr(float lr) {  // every group
    for (std::size_t g = 0; g < ctl_.groups.size(); ++g) ctl_.groups.set_lr(g, lr);
  }
  void set_lr(std::string_view group, float lr) { ctl_.groups.set_lr(ctl_.groups.index_of(group), lr); }
  const optim::param_groups& param_groups() const noexcept { return ctl_.groups; }
  std::int64_t steps_taken() const noexcept { return step_; }

  // ---- full values across ranks (engine/full_state.hpp): COLLECTIVE, one parameter at a time --
  std::vector<float> gather_param(param_id p) { return full_state<engine>::gather_param(*this, p); }
  void write_param(param_id p, std::span<const float> value, int writer) {
    full_state<engine>::write_param(*this, p, value, writer);
  }
  std::vector<float> gather_grad(param_id p) { return full_state<engine>::gather_grad(*this, p); }
  std::vector<float> gather_optimizer_state(param_id p, state_field f) {
    return full_state<engine>::gather_optimizer_state(*this, p, f);
  }
  void write_optimizer_state(param_id p, state_field f, std::span<const float> value, int writer) {
    full_state<engine>::write_optimizer_state(*this, p, f, value, writer);
  }

  // ---- state access (state/state_access.hpp): per rank, between steps ------------------------
  // Elements [offset, offset + n) of field f of p's shard on this rank, to or from host memory
  // (working: p's dtype; master, m, v: f32, trainable parameters only). Checkpoints, pretrained
  // loading and parameter tools are built on these; a write takes effect at the next gather.
  void read_shard(param_id p, state_field f, std::size_t offset, void* host_dst, std::size_t n) {
    shard_state<engine>::read(*this, p, f, offset, host_dst, n);
  }
  void write_shard(param_id p, state_field f, std::size_t offset, const void* host_src, std::size_t n) {
    shard_state<engine>::write(*this, p, f, offset, host_src, n);
  }
  // Field f of p's shard as host memory the CPU may read and write directly (host backend,
  // offloaded optimizer state), so checkpoints move file bytes straight in and out of it
  // without a staging copy; null when the field lives in device memory. Valid between steps.
  void* shard_host_data(param_id p, state_field f) { return shard_state<engine>::host_data(*this, p, f); }
  // The default group's learning rate (a checkpoint records that one; other groups' rates are the
  // training loop's to set again after a load).
  run_state run_counters() const noexcept { return {step_, lr(), scaler_.state()}; }
  // Validates all of s before changing anything.
  void restore_run_counters(const run_state& s) {
    check_between_steps("restore_run_counters");
    ZSHARD_REQUIRE(s.step >= 0, error_kind::config, "run state has a negative step count " + std::to_string(s.step));
    ZSHARD_REQUIRE(std::isfinite(s.lr) && s.lr > 0, error_kind::config,
                   "run state has learning rate " + std::to_string(s.lr) + ", not positive and finite");
    optim::loss_scaler scaler = scaler_;
    scaler.restore(s.scaler);
    scaler_ = scaler;
    ctl_.groups.set_lr(0, s.lr);
    step_ = s.step;
    // Without per-parameter counts (restore_update_counts), every parameter continues from the step.
    if constexpr (requires { offloader_.set_update_counts(s.step); }) offloader_.set_update_counts(s.step);
  }
  // Each parameter's own AdamW update count, by param_id (a parameter without a gradient in a
  // step is not updated and its count lags the engine's step). Per rank; a rank holding no
  // element of a parameter may lag on it, rank 0 holds elements of every one (checkpoints save
  // rank 0's). Empty when the Offloader keeps no counts.
  std::vector<std::int64_t> update_counts() const {
    if constexpr (requires { offloader_.update_counts(); })
      return offloader_.update_counts();
    else
      return {};
  }
  // After restore_run_counters: every count in [0, steps_taken()], one per parameter; validated
  // before anything changes.
  void restore_update_counts(const std::vector<std::int64_t>& counts) {
    check_between_steps("restore_update_counts");
    ZSHARD_REQUIRE(counts.size() == spec_.params().size(), error_kind::config,
                   std::to_string(counts.size()) + " update counts for a model of " +
                       std::to_string(spec_.params().size()) + " parameters");
    for (std::size_t p = 0; p < counts.size(); ++p)
      ZSHARD_REQUIRE(counts[p] >= 0 && counts[p] <= step_, error_kind::config,
                     "update count " + std::to_string(counts[p]) + " of '" + spec_.params()[p].name +
                         "' is outside [0, " + std::to_string(step_) + "] (the engine's step)");
    if constexpr (requires { offloader_.set_update_counts(std::span<const std::int64_t>(counts)); })
      offloader_.set_update_counts(std::span<const std::int64_t>(counts));
  }

  const model_spec& spec() const noexcept { return spec_; }
  const engine_config& config() const noexcept { return cfg_; }
  const shard_layout& layout(param_id p) const {
    engine_checks::param_id_in_range(spec_, p, "layout");
    return layouts_[p];
  }
  Backend& backend() noexcept { return backend_; }
  // The communicator of this rank's shard group (the world's unless hybrid): shards, gathers.
  Comm& comm() noexcept { return comm_; }
  // The communicator of gradient reductions: comm() unless the engine was given another.
  Comm& reduce_comm() noexcept { return reduce_comm_; }
  // Hybrid sharding: the whole world (settings, schedule and step checks), the replica group
  // (the all-reduce of gradient shards across shard groups; null when flat) and the layout.
  Comm& world_comm() noexcept { return groups_.world(); }
  Comm* replica_comm() noexcept { return groups_.replica(); }
  const hybrid_layout& hybrid() const noexcept { return hybrid_; }
  // This rank's shard group (0 .. replicas - 1): its replica index.
  int replica_index() const noexcept { return hybrid_.group_of(agreement_world_rank()); }
  bool separate_reduce_comm() const noexcept { return &reduce_comm_ != &comm_; }
  const memory_ledger& ledger() const noexcept { return backend_.ledger(); }
  const param_store<Backend>& store() const noexcept { return store_; }
  const residency<Backend, Comm, prefetcher_type>& residency_state() const noexcept { return residency_; }
  // The stream the training stack's kernels in a scope run on (scope.stream() says the same).
  const stream_type& compute_stream() const noexcept { return store_.streams().stream_of(stream_role::compute); }
  std::size_t resident_numel() const noexcept { return store_.resident_numel(); }
  const tracker_type& tracker() const noexcept { return tracker_; }
  const offloader_type& offloader() const noexcept { return offloader_; }
  const prefetcher_type& prefetcher() const noexcept { return prefetcher_; }
  const reducer_type& reducer() const noexcept { return reducer_; }
  int open_scopes() const noexcept { return scopes_.count(); }
  // The running schedule fingerprint (engine/schedule_fingerprint.hpp).
  const schedule_fingerprint& schedule() const noexcept { return fp_; }

  // Collective: every rank calls it. Drops every gradient accumulated since the last step (the
  // micro-batches before included: their reduced sums are mixed into the same shards), so a
  // micro-batch whose backward failed half-way is never applied, and puts the engine back at
  // the start of a step: nothing gathered, nothing pending, the schedule resynchronised across
  // ranks (which may have stopped at different points). Required after a scope was left by an
  // exception. It cannot repair an engine broken by a failed collective.
  void discard_gradients() {
    rethrow_if_broken();
    ZSHARD_REQUIRE(scopes_.count() == 0, error_kind::usage, "discard_gradients() with module scopes still open",
                   "let the scopes of the failed micro-batch close (or unwind) first");
    agreement_.resynchronize(fp_);
    fp_.on_event(schedule_event::discard);
    if constexpr (requires { reducer_.discard(); })
      reducer_.discard();
    else
      reducer_.flush(sink_);
    for (param_id p = 0; p < store_.size(); ++p) store_[p].full_grad.reset_on(store_.streams().on(stream_role::compute));
    tracker_.reset(spec_);
    ctl_.sync.discard();
    residency_.end_holds();
    residency_.release_unpinned();
    offloader_.discard_grads();
    prefetcher_.on_step();
    micro_batches_ = 0;
    swept_.clear();
    abandoned_.clear();
  }

 private:
  friend scope;
  friend class full_state<engine>;
  friend class shard_state<engine>;
  friend class training_controls<engine>;
  using controls = training_controls<engine>;

  // ---- construction --------------------------------------------------------------------------
  static Comm& checked_reduce_comm(Comm& comm, Comm& reduce) {
    ZSHARD_REQUIRE(reduce.rank() == comm.rank() && reduce.size() == comm.size(), error_kind::config,
                   "the reduce communicator is rank " + std::to_string(reduce.rank()) + " of " +
                       std::to_string(reduce.size()) + ", the engine's communicator rank " +
                       std::to_string(comm.rank()) + " of " + std::to_string(comm.size()),
                   "give reductions a communicator over the same ranks in the same order (ncclCommSplit with one "
                   "colour and key = rank, or a second communicator of the same world)");
    return reduce;
  }

  int agreement_world_rank() const noexcept { return groups_.world_rank(); }

  // The step's gradient norm over the world counts each shard once: the replicas of a shard group
  // hold bitwise the same gradient shards, so only replica 0 adds its part (sum of squares, sum of
  // |g| or max |g|, engine/grad_norm.hpp; +0.0 from the others leaves a sum unchanged, bit for
  // bit, and a max too). An Inf/NaN is reported by every rank.
  local_grad_norm counted_grad_norm() {
    local_grad_norm g = local_grad_norm_of(offloader_, cfg_.clip_norm_type);
    if (replica_index() != 0) g.part = 0.0;
    return g;
  }

  static model_spec validated(model_spec s) {
    s.validate();
    return s;
  }
  // Also tags every log line with the rank that says it.
  static engine_config validated(engine_config c, int rank) {
    c.validate();
    c.log = [sink = std::move(c.log), rank](const std::string& line) {
      say(sink, "rank " + std::to_string(rank) + ": " + line);
    };
    return c;
  }

  // The rank's share of the trace, watching its ledger from before the first allocation.
  static rank_trace* start_trace(Backend& backend, const engine_config& c, int rank) {
    if (!c.trace) return nullptr;
    rank_trace& t = c.trace->rank(rank);
    t.watch(backend.ledger());
    return &t;
  }

  // engine_config::log promises swept uses (I3): a forward whose backward never ran. Said once
  // per module, so a loop that sweeps every step does not flood the log; step_report::swept
  // lists every one.
  void log_swept(std::size_t from) {
    for (std::size_t i = from; i < swept_.size(); ++i) {
      const module_id m = swept_[i].module;
      if (swept_said_.size() <= m) swept_said_.resize(spec_.modules().size(), false);
      if (swept_said_[m]) continue;
      swept_said_[m] = true;
      cfg_.say("swept " + std::to_string(swept_[i].pending_uses) + " use(s) of module '" + spec_.module(m).name +
               "' whose backward never ran: released and reduced at end_backward (use use_kind::no_grad for passes "
               "without backward; said once per module, step_report::swept lists every one)");
    }
  }

  // Rank r computes exactly its shard's initial values from the global element index.
  void initialize_parameters() {
    if constexpr (Backend::holds_storage) {
      const auto rank = comm_.rank();
      std::vector<float> values;
      for (param_id p = 0; p < store_.size(); ++p) {
        auto& s = store_[p];
        const std::size_t n = s.layout.shard_numel;
        values.assign(n, 0.0f);
        const std::size_t begin = s.layout.owned_begin(rank), end = s.layout.owned_end(rank);
        for (std::size_t g = begin; g < end; ++g) values[g - begin] = s.spec->init(static_cast<std::int64_t>(g));
        auto& compute = store_.streams().on(stream_role::compute);
        buffer<Backend> staging = scratch(dtype::f32, n);
        backend_.copy(staging.data(), values.data(), n * sizeof(float), compute);
        if (void* host = store_.host_shard(p))  // offloaded (param_store.hpp): written where it lives
          zshard::convert(values.data(), dtype::f32, host, s.type, n);
        else
          backend_.convert(staging.data(), dtype::f32, s.shard.data(), s.type, n, compute);
        if (s.spec->trainable) offloader_.init_param(p, staging.template as<float>());
        backend_.synchronize(compute);
      }
    }
  }

  // ---- scopes --------------------------------------------------------------------------------
  // Exception-safe: the residency rolls back its own pins and gathers, gradient buffers made
  // here are freed, the tracker is told last (its checks throw before it changes anything) and
  // the fingerprint is restored, so a failed open leaves the engine as it was.
  void enter_scope(module_id m, use_kind kind, bool is_backward) {
    rethrow_if_unusable();
    engine_checks::module_id_in_range(spec_, m, "engine scope (forward/recompute/backward)");
    scopes_.check_can_open(spec_, m, is_backward);
    if (is_backward)  // a usage error here changes nothing
      tracker_.on_backward(m);
    else
      tracker_.on_forward(m, kind);
    const auto saved = fp_.save();
    fp_.on_scope(m, kind, is_backward);
    controls::count_scope(*this);
    store_.collective_context = fp_.tag(collective_use::gather, m);
    made_grads_.clear();
    int stage = 0;  // 1: the Prefetcher saw the scope, 2: the residency opened it
    try {
      if (cfg_.check_every_scope) agreement_.at_scope(fp_);
      ahead_.clear();
      prefetcher_.on_scope_enter(m, kind, ahead_);
      stage = 1;
      {
        trace_span t(trace_, "gather", ahead_.empty() ? "gather" : "gather + prefetch", spec_.modules()[m].name);
        residency_.open(m, ahead_, store_.collective_context);
      }
      stage = 2;
      if (is_backward) make_full_grads(m);
    } catch (const error& e) {
      undo_open(m, kind, is_backward, stage, saved);
      if (e.kind() != error_kind::comm) throw;
      throw error(e.kind(),
                  e.message() + " [rank " + std::to_string(comm_.rank()) + " was opening " +
                      engine_checks::scope_name(spec_, m, kind, is_backward) + " as scope #" +
                      std::to_string(fp_.scopes() + 1) + "]",
                  e.hint());
    } catch (...) {
      undo_open(m, kind, is_backward, stage, saved);
      throw;
    }
    if (trace_) [[unlikely]]
      trace_->scope_open(m, is_backward ? "backward" : kind == use_kind::counted ? "forward" : to_string(kind));
  }
  void opened_scope(scope* s) noexcept { scopes_.opened(s, s->module(), s->is_backward()); }

  void make_full_grads(module_id m) {
    auto& compute = store_.streams().on(stream_role::compute);
    for (param_id p : spec_.modules()[m].params) {  // m checked by enter_scope
      auto& s = store_[p];
      if (!s.spec->trainable || s.full_grad) continue;
      s.full_grad = buffer<Backend>(backend_, dtype::f32, s.layout.padded_numel, mem_category::grad_buckets, compute);
      made_grads_.push_back(p);
      backend_.fill_zero(s.full_grad.data(), s.full_grad.bytes(), compute);
    }
  }

  // Rolls back a scope whose open failed; the policies that can take back what they were told
  // (optional on_scope_failed, see track/hook_tracker.hpp and prefetch/prefetcher.hpp) do.
  void undo_open(module_id m, use_kind kind, bool is_backward, int stage,
                 const schedule_fingerprint::saved& saved) noexcept {
    fp_.restore(saved);
    for (param_id p : made_grads_) store_[p].full_grad.reset_on(store_.streams().on(stream_role::compute));
    try {
      if (stage >= 2) residency_.close(m, false, false);
      if constexpr (requires { prefetcher_.on_scope_failed(m, kind); })
        if (stage >= 1) prefetcher_.on_scope_failed(m, kind);
      if constexpr (requires { tracker_.on_scope_failed(m, kind, is_backward); })
        tracker_.on_scope_failed(m, kind, is_backward);
    } catch (...) {
      broken_ = std::current_exception();
    }
  }

  // A failure half-way through closing a scope (a collective in the Reducer, an invariant)
  // leaves pins and counts inconsistent, so it breaks the engine: every later call rethrows it.
  void exit_scope(scope* sc) {
    rethrow_if_broken();
    const module_id m = sc->module();
    const bool is_backward = sc->is_backward();
    sc->end();
    scopes_.ended(sc, m, is_backward);
    try {
      if (trace_) [[unlikely]] trace_->scope_close(m, is_backward, spec_.modules()[m].name);
      store_.streams().note_work(stream_role::compute);  // the scope's own kernels, before any reduction of them
      if (is_backward) {
        completed_.clear();
        tracker_.on_backward_done(m, completed_);
        trace_span t(trace_, "reduce", "reduce-scatter", spec_.modules()[m].name);
        for (param_id p : completed_) ctl_.sync.complete(p, reduce_);
      }
      trace_span t(trace_, "release", "release", spec_.modules()[m].name);
      residency_.close(m, tracker_.keeps_gathered(m), controls::prefers_gathered(*this, m));
    } catch (...) {
      broken_ = std::current_exception();
      throw;
    }
  }

  void exit_scope_nothrow(scope* sc) noexcept {
    try {
      exit_scope(sc);
    } catch (...) {
      // kept in broken_ by exit_scope (or already there): the next engine call rethrows it
    }
  }

  // A scope destroyed by an exception: released without a collective; the engine then waits
  // for discard_gradients().
  void abandon_scope(scope* sc) noexcept {
    const module_id m = sc->module();
    const bool is_backward = sc->is_backward();
    sc->end();
    scopes_.ended(sc, m, is_backward);
    try {
      abandoned_ = engine_checks::scope_name(spec_, m, use_kind::counted, is_backward);
      residency_.close(m, false, false);
    } catch (...) {
      if (!broken_) broken_ = std::current_exception();
    }
  }

  void moved_scope(scope* from, scope* to) noexcept { scopes_.moved(from, to); }

  const_view param_view(module_id m, std::size_t k) const {
    const auto& params = spec_.module(m).params;
    ZSHARD_REQUIRE(k < params.size(), error_kind::usage,
                   "module '" + spec_.module(m).name + "' has " + std::to_string(params.size()) +
                       " parameters, asked for #" + std::to_string(k));
    const auto& s = store_[params[k]];
    return {s.full_data(), s.type, s.spec->shape};
  }

  mutable_view grad_view(module_id m, std::size_t k) const {
    const auto& params = spec_.module(m).params;
    ZSHARD_REQUIRE(k < params.size(), error_kind::usage,
                   "parameter index out of range in module '" + spec_.module(m).name + "'");
    const auto& s = store_[params[k]];
    ZSHARD_REQUIRE(s.spec->trainable, error_kind::usage,
                   "parameter '" + s.spec->name + "' is frozen and has no gradient");
    return {s.full_grad.data(), dtype::f32, s.spec->shape};
  }

  // ---- between steps --------------------------------------------------------------------------
  void check_between_steps(const char* what) const {
    rethrow_if_broken();
    ZSHARD_REQUIRE(scopes_.count() == 0 && micro_batches_ == 0 && tracker_.phase() == step_phase::forward &&
                       !controls::counted_uses_pending(*this),
                   error_kind::usage,
                   std::string(what) + " during a step (a scope is open or a micro-batch awaits step())",
                   "call it between step() and the next forward");
  }

  // Scratch for the engine's own compute work, allocated in the compute stream's order (the
  // training stack's stream when it brought one), so that work on it may use it at once.
  buffer<Backend> scratch(dtype t, std::size_t n) {
    return buffer<Backend>(backend_, t, n, mem_category::scratch, store_.streams().on(stream_role::compute));
  }

  // The optimizer (or initialisation) wrote the working shards on compute: later gathers read
  // them. (Reductions need no extra wait: each waits for compute anyway, for the gradients.)
  void publish_shards() { store_.streams().order(stream_role::gather, stream_role::compute); }

  void check(bool ok, const char* what) const {
    if (!ok) throw error(error_kind::invariant, what);
  }
  void rethrow_if_broken() const {
    if (broken_) std::rethrow_exception(broken_);
  }
  void rethrow_if_unusable() const {
    if (broken_ || !abandoned_.empty()) [[unlikely]]
      throw_unusable();
  }
  [[noreturn, gnu::cold, gnu::noinline]] void throw_unusable() const {
    rethrow_if_broken();
    throw error(error_kind::usage,
                "the " + abandoned_ + " scope was left by an exception, so this micro-batch's gradients are partial",
                "call discard_gradients() on every rank, then run the micro-batch again");
  }

  Backend& backend_;
  const int uncaught_at_construction_ = std::uncaught_exceptions();
  model_spec spec_;  // not const: set_trainable changes a parameter's flag (between steps)
  const engine_config cfg_;
  rank_trace* trace_;  // null unless cfg_.trace: before store_, so it sees every allocation
  const hybrid_layout hybrid_;  // flat (one shard group: the world) unless cfg_.hybrid says otherwise
  [[no_unique_address]] partitioner_type partitioner_{};
  std::vector<shard_layout> layouts_;  // over a shard group
  hybrid_groups<Backend, Comm> groups_;
  Comm& comm_;         // the shard group's communicator (the world's when flat)
  Comm& reduce_comm_;  // comm_ unless a second communicator was given
  comm_watch<Backend, Comm> watch_;  // the backend's host waits check every communicator
  param_store<Backend> store_;
  offloader_type offloader_;
  sink_type sink_;  // the Offloader, behind the all-reduce across replica groups when hybrid
  reducer_type reducer_;
  tracker_type tracker_{};
  prefetcher_type prefetcher_{};
  residency<Backend, Comm, prefetcher_type> residency_;
  rank_agreement<Backend, Comm> agreement_;
  schedule_fingerprint fp_;
  scope_registry<scope> scopes_;
  std::vector<param_id> made_grads_;  // gradient buffers made by the scope being opened
  std::string abandoned_;  // the scope left by an exception, until discard_gradients()
  optim::loss_scaler scaler_;
  training_control_state ctl_;  // parameter groups, gradient sync, kept modules, passes
  // The Reducer's entry, for grad_sync to call when a gradient is reduced now.
  struct reduce_now {
    engine* e;
    void operator()(param_id p) const { e->reducer_.grad_ready(p, e->sink_); }
  } reduce_{this};
  std::int64_t step_ = 0;
  int micro_batches_ = 0;
  std::size_t activation_bytes_ = 0;
  std::vector<param_id> completed_;
  std::vector<param_id> ahead_;
  std::vector<swept_use> swept_;
  std::vector<bool> swept_said_;  // modules whose sweep was logged
  std::exception_ptr broken_;
};

}  // namespace zshard

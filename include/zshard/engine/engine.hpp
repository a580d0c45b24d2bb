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
//
// The class holds the state and the public calls; the work of the larger ones is in friend
// helpers beside it: engine_setup.hpp (construction), scope_lifecycle.hpp (scopes),
// step_boundary.hpp (end_backward, step, discard_gradients), step_counters.hpp, full_state.hpp,
// shard_state.hpp and training_controls.hpp.
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
#include "zshard/engine/engine_setup.hpp"
#include "zshard/engine/full_state.hpp"
#include "zshard/engine/grad_norm.hpp"
#include "zshard/engine/hybrid_groups.hpp"
#include "zshard/engine/module_scope.hpp"
#include "zshard/engine/open_scopes.hpp"
#include "zshard/engine/rank_agreement.hpp"
#include "zshard/engine/scope_lifecycle.hpp"
#include "zshard/engine/schedule_fingerprint.hpp"
#include "zshard/engine/settings_check.hpp"
#include "zshard/engine/shard_state.hpp"
#include "zshard/engine/residency.hpp"
#include "zshard/engine/step_boundary.hpp"
#include "zshard/engine/step_counters.hpp"
#include "zshard/engine/step_report.hpp"
#include "zshard/engine/training_controls.hpp"
#include "zshard/offload/host_memory.hpp"
#include "zshard/offload/offloader.hpp"
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
        spec_(setup::validated(std::move(spec))),
        cfg_(setup::validated(std::move(cfg), comm.rank())),
        trace_(setup::start_trace(backend, cfg_, comm.rank())),
        hybrid_(hybrid_layout::of(cfg_.hybrid, comm.size())),
        layouts_(engine_checks::make_layouts(partitioner_, spec_, cfg_, hybrid_.group_size)),
        groups_(backend, comm, setup::checked_reduce_comm(comm, reduce_comm), hybrid_, cfg_.hybrid,
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
    setup::initialize_parameters(*this);
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
  // Reducer and releases every non-persistent gathered parameter (engine/step_boundary.hpp).
  void end_backward() { step_boundary<engine>::end_backward(*this); }

  // The optimizer step over all micro-batches since the last one: global gradient norm and
  // overflow check, clipping, AdamW, new working shards. Every rank decides identically
  // (engine/step_boundary.hpp).
  step_report step() { return step_boundary<engine>::step(*this); }

  // ---- forward-only passes and what changes between steps (engine/training_controls.hpp) ------
  // end_pass(): the boundary of a forward-only pass (use_kind::no_grad forwards only).
  void end_pass() { controls::end_pass(*this); }
  std::int64_t passes() const noexcept { return ctl_.passes; }
  // Collective (every rank, same arguments; checked): freeze / unfreeze p between steps.
  void set_trainable(param_id p, bool trainable) { controls::set_trainable(*this, p, trainable); }
  // Optimizer state (master, m, v) of p: trainable, or frozen with the state it kept (checkpoints
  // save and restore it); whether it can be created for frozen p, and creating it (per rank).
  bool has_optimizer_state(param_id p) const { return controls::has_optimizer_state(*this, p); }
  bool can_add_optimizer_state(param_id p) const { return controls::can_add_optimizer_state(*this, p); }
  void add_optimizer_state(param_id p) { controls::add_optimizer_state(*this, p); }
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
  // Validates all of s before changing anything (engine/step_counters.hpp).
  void restore_run_counters(const run_state& s) { step_counters<engine>::restore_run_counters(*this, s); }
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
    step_counters<engine>::restore_update_counts(*this, counts);
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
  void discard_gradients() { step_boundary<engine>::discard_gradients(*this); }

 private:
  friend scope;
  friend class full_state<engine>;
  friend class shard_state<engine>;
  friend class training_controls<engine>;
  friend class step_boundary<engine>;
  friend class scope_lifecycle<engine>;
  friend class engine_setup<engine>;
  friend class step_counters<engine>;
  using controls = training_controls<engine>;
  using setup = engine_setup<engine>;  // construction (engine/engine_setup.hpp)

  int agreement_world_rank() const noexcept { return groups_.world_rank(); }

  // ---- scopes (engine/scope_lifecycle.hpp) ----------------------------------------------------
  void enter_scope(module_id m, use_kind kind, bool is_backward) {
    scope_lifecycle<engine>::enter(*this, m, kind, is_backward);
  }
  void opened_scope(scope* s) noexcept { scopes_.opened(s, s->module(), s->is_backward()); }
  void exit_scope(scope* sc) { scope_lifecycle<engine>::exit(*this, sc); }

  void exit_scope_nothrow(scope* sc) noexcept {
    try {
      exit_scope(sc);
    } catch (...) {
      // kept in broken_ by exit_scope (or already there): the next engine call rethrows it
    }
  }

  // A scope destroyed by an exception: released without a collective; the engine then waits
  // for discard_gradients().
  void abandon_scope(scope* sc) noexcept { scope_lifecycle<engine>::abandon(*this, sc); }

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
  // Gradient buffers made by the scope being opened: the first made_count_ entries (the vector
  // only grows, to the largest module's parameter count, so a backward scope appends by index).
  std::vector<param_id> made_grads_;
  std::size_t made_count_ = 0;
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

#pragma once
// The ZeRO-3 engine: composes a Backend, a Communicator and five policies into the scopes a
// training stack calls (see README and DESIGN.md):
//
//   for each micro-batch:
//     forward(m) per module, begin_backward(), [recompute(m)] + backward(m) per module in
//     reverse, end_backward()
//   step()
//
// The engine owns the sequencing and the checks that bind the policies together; each policy
// owns one decision (layout, what to keep gathered, when to reduce, where the optimizer runs,
// which uses count). One engine per rank, used from that rank's thread.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "zshard/backend/backend.hpp"
#include "zshard/comm/communicator.hpp"
#include "zshard/engine/default_policies.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/engine/module_scope.hpp"
#include "zshard/engine/residency.hpp"
#include "zshard/engine/step_report.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/optim/grad_clip.hpp"
#include "zshard/optim/loss_scaler.hpp"
#include "zshard/prefetch/prefetcher.hpp"
#include "zshard/reduce/reducer.hpp"
#include "zshard/state/param_store.hpp"
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
                              policy_impl_t<typename Policies::offloader, Backend, Comm>>());

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

  // `compute`: the training stack's compute stream, when it brings its own; the engine's work
  // that the stack's kernels read or write (and gathers and reductions, through events) is
  // ordered on it. Default: the backend's compute stream.
  engine(Backend& backend, Comm& comm, model_spec spec, engine_config cfg,
         std::optional<stream_type> compute = std::nullopt)
      : backend_(backend),
        comm_(comm),
        spec_(validated(std::move(spec))),
        cfg_(validated(std::move(cfg), comm.rank())),
        trace_(start_trace(backend, cfg_, comm.rank())),
        layouts_(make_layouts()),
        store_(backend, spec_, layouts_, cfg_.param_dtype, cfg_.overlap, compute ? &*compute : nullptr),
        offloader_(store_, comm, cfg_.adamw, cfg_.offload),
        reducer_(store_, comm, cfg_.reduce),
        residency_(store_, comm, prefetcher_, cfg_.prefetch),
        scaler_(cfg_.loss_scale),
        lr_(cfg_.adamw.lr) {
    check_same_model_on_every_rank();
    check_module_sizes();
    tracker_.reset(spec_);
    prefetcher_.reset(spec_, layouts_, cfg_.prefetch, cfg_.log);
    initialize_parameters();
    publish_shards();
    completed_.reserve(spec_.params().size());
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  // Waits for work still queued on the role streams (a gather ahead, say), so that no buffer
  // is freed under it.
  ~engine() {
    try {
      store_.streams().synchronize_all();
    } catch (...) {
      // already failed (a collective timed out, a device error): the backend reports it again
    }
    if (activation_bytes_) backend_.ledger().release(mem_category::activations, activation_bytes_);
    if (trace_) trace_->unwatch();
  }

  // ---- the scopes ----------------------------------------------------------------------------
  // A forward use of m; `counted` unless grad mode is off for this pass (use_kind::no_grad).
  scope forward(module_id m, use_kind kind = use_kind::counted) {
    ZSHARD_REQUIRE(kind != use_kind::recompute, error_kind::usage, "use recompute(m) for a checkpointed re-run");
    enter_scope(m, kind, false);
    return scope(this, m, false);
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
    rethrow_if_broken();
    ZSHARD_REQUIRE(open_scopes_ == 0, error_kind::usage,
                   "begin_backward() with " + std::to_string(open_scopes_) + " module scope(s) still open");
    tracker_.on_begin_backward();
  }

  // Ends a micro-batch's backward: sweeps uses whose backward never ran (I3), flushes the
  // Reducer and releases every non-persistent gathered parameter.
  void end_backward() {
    rethrow_if_broken();
    ZSHARD_REQUIRE(open_scopes_ == 0, error_kind::usage,
                   "end_backward() with " + std::to_string(open_scopes_) + " module scope(s) still open");
    completed_.clear();
    const std::size_t swept_before = swept_.size();
    tracker_.on_end_backward(completed_, swept_);
    log_swept(swept_before);
    {
      trace_span t(trace_, "reduce", "reduce-scatter (end of backward)");
      for (param_id p : completed_) reducer_.grad_ready(p, offloader_);
      reducer_.flush(offloader_);
    }
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
    rethrow_if_broken();
    ZSHARD_REQUIRE(open_scopes_ == 0, error_kind::usage, "step() with module scopes still open");
    tracker_.on_step();
    ZSHARD_REQUIRE(micro_batches_ > 0, error_kind::usage, "step() without a backward since the last step",
                   "run at least one forward/begin_backward/backward/end_backward before step()");
    step_report r;
    r.micro_batches = micro_batches_;
    r.swept = std::move(swept_);
    swept_.clear();

    store_.streams().order(stream_role::compute, stream_role::reduce);  // the Offloader reads gradient shards
    const auto [sum_squares, overflow] = [&] {
      trace_span t(trace_, "wait", "gradient norm all-reduce (waits for every rank)");
      return global_grad_stats();
    }();
    const double denom = double(micro_batches_) * double(scaler_.scale());
    r.grad_norm = std::sqrt(sum_squares) / denom;
    if (overflow) {
      r.skipped = true;
      r.grad_norm = INFINITY;
      offloader_.discard_grads();
    } else {
      r.clip_coefficient = optim::clip_coefficient(r.grad_norm, cfg_.clip_norm);
      trace_span t(trace_, "optimizer", "optimizer (AdamW, host copies)");
      offloader_.update({++step_, lr_, static_cast<float>(r.clip_coefficient / denom)});
    }
    publish_shards();
    scaler_.update(overflow);
    r.step = step_;
    r.loss_scale = scaler_.scale();
    micro_batches_ = 0;
    prefetcher_.on_step();
    trace_span t(trace_, "release", "release (step)");
    residency_.release_unpinned();
    check(store_.gathered_set().empty() && reducer_.pending_numel() == 0, "step boundary is not clean (I4)");
    check(residency_.resident_by_scan() == store_.resident_numel(),
          "resident elements disagree with the gathered set (I5)");
    return r;
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
  float lr() const noexcept { return lr_; }
  void set_lr(float lr) {
    ZSHARD_REQUIRE(std::isfinite(lr) && lr > 0, error_kind::config, "learning rate must be positive and finite");
    lr_ = lr;
  }
  std::int64_t steps_taken() const noexcept { return step_; }

  // Collective: every rank calls it; returns p's full value as f32 (tests, checkpoints, eval).
  std::vector<float> gather_param(param_id p) {
    rethrow_if_broken();
    const auto& s = store_[p];
    auto& streams = store_.streams();
    buffer<Backend> staging = scratch(dtype::f32, s.layout.padded_numel);
    if (s.layout.replicated) {
      backend_.convert(s.shard.data(), s.type, staging.data(), dtype::f32, s.layout.numel,
                       streams.on(stream_role::compute));
    } else {
      buffer<Backend> full = scratch(s.type, s.layout.padded_numel);
      comm_.all_gather(s.shard.data(), full.data(), s.layout.shard_numel, s.type,
                       streams.collective_on(stream_role::compute));
      backend_.convert(full.data(), s.type, staging.data(), dtype::f32, s.layout.numel,
                       streams.on(stream_role::compute));
    }
    std::vector<float> out(s.layout.numel);
    backend_.copy(out.data(), staging.data(), out.size() * sizeof(float), streams.on(stream_role::compute));
    backend_.synchronize(streams.on(stream_role::compute));
    return out;
  }

  const model_spec& spec() const noexcept { return spec_; }
  const engine_config& config() const noexcept { return cfg_; }
  const shard_layout& layout(param_id p) const noexcept { return layouts_[p]; }
  Backend& backend() noexcept { return backend_; }
  Comm& comm() noexcept { return comm_; }
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
  int open_scopes() const noexcept { return open_scopes_; }

 private:
  friend scope;

  // ---- construction --------------------------------------------------------------------------
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

  std::vector<shard_layout> make_layouts() const {
    std::vector<shard_layout> l;
    l.reserve(spec_.params().size());
    for (const auto& p : spec_.params()) l.push_back(partitioner_.layout(p.numel(), comm_.size(), cfg_.partition));
    return l;
  }

  // Ranks that disagree on the model would issue mismatched collectives: catch it up front.
  void check_same_model_on_every_rank() {
    if constexpr (Backend::holds_storage) {
      std::uint64_t fp = spec_.fingerprint() ^ (std::uint64_t(cfg_.param_dtype) << 56) ^
                         (cfg_.partition.persistence_threshold_numel * 0x9e3779b97f4a7c15ull) ^
                         cfg_.partition.shard_alignment_numel;
      const auto world = static_cast<std::size_t>(comm_.size());
      std::vector<std::uint64_t> all(world);
      buffer<Backend> mine = scratch(dtype::f32, 2);
      buffer<Backend> gathered = scratch(dtype::f32, 2 * world);
      auto& streams = store_.streams();
      backend_.copy(mine.data(), &fp, sizeof fp, streams.on(stream_role::compute));
      // 64 bits as two f32 words: a copy
      comm_.all_gather(mine.data(), gathered.data(), 2, dtype::f32, streams.collective_on(stream_role::compute));
      backend_.copy(all.data(), gathered.data(), world * sizeof fp, streams.on(stream_role::compute));
      backend_.synchronize(streams.on(stream_role::compute));
      for (std::size_t r = 0; r < world; ++r)
        ZSHARD_REQUIRE(all[r] == fp, error_kind::config,
                       "rank " + std::to_string(comm_.rank()) + " and rank " + std::to_string(r) +
                           " registered different models or partition settings",
                       "build the same model_spec and engine_config on every rank");
    }
  }

  void check_module_sizes() const {
    for (module_id m = 0; m < spec_.modules().size(); ++m) {
      const std::size_t n = residency_.module_gathered_numel(m);
      ZSHARD_REQUIRE(
          n <= cfg_.prefetch.max_live_numel || cfg_.prefetch.allow_oversized_module, error_kind::config,
          "module '" + spec_.module(m).name + "' needs " + std::to_string(n) +
              " gathered elements, more than max_live_numel = " + std::to_string(cfg_.prefetch.max_live_numel),
          "raise max_live_numel, split the module, or set allow_oversized_module");
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
        backend_.convert(staging.data(), dtype::f32, s.shard.data(), s.type, n, compute);
        if (s.spec->trainable) offloader_.init_param(p, staging.template as<float>());
        backend_.synchronize(compute);
      }
    }
  }

  // ---- scopes --------------------------------------------------------------------------------
  void enter_scope(module_id m, use_kind kind, bool is_backward) {
    rethrow_if_broken();
    ZSHARD_REQUIRE(m < spec_.modules().size(), error_kind::usage, "module id " + std::to_string(m) + " does not exist");
    if (is_backward)
      tracker_.on_backward(m);
    else
      tracker_.on_forward(m, kind);
    ahead_.clear();
    prefetcher_.on_scope_enter(m, kind, ahead_);
    {
      trace_span t(trace_, "gather", ahead_.empty() ? "gather" : "gather + prefetch", spec_.module(m).name);
      residency_.open(m, ahead_);
    }
    if (is_backward) {
      for (param_id p : spec_.module(m).params) {
        auto& s = store_[p];
        if (!s.spec->trainable || s.full_grad) continue;
        auto& compute = store_.streams().on(stream_role::compute);
        s.full_grad = buffer<Backend>(backend_, dtype::f32, s.layout.padded_numel, mem_category::grad_buckets, compute);
        backend_.fill_zero(s.full_grad.data(), s.full_grad.bytes(), compute);
      }
    }
    ++open_scopes_;
    if (trace_) [[unlikely]]
      trace_->scope_open(m, is_backward ? "backward" : kind == use_kind::counted ? "forward" : to_string(kind));
  }

  // A failure half-way through closing a scope (a collective in the Reducer, an invariant)
  // leaves pins and counts inconsistent, so it breaks the engine: every later call rethrows it.
  void exit_scope(module_id m, bool is_backward) {
    rethrow_if_broken();
    try {
      --open_scopes_;
      if (trace_) [[unlikely]] trace_->scope_close(m, is_backward, spec_.module(m).name);
      store_.streams().note_work(stream_role::compute);  // the scope's own kernels, before any reduction of them
      if (is_backward) {
        completed_.clear();
        tracker_.on_backward_done(m, completed_);
        trace_span t(trace_, "reduce", "reduce-scatter", spec_.module(m).name);
        for (param_id p : completed_) reducer_.grad_ready(p, offloader_);
      }
      trace_span t(trace_, "release", "release", spec_.module(m).name);
      residency_.close(m, tracker_.keeps_gathered(m));
    } catch (...) {
      broken_ = std::current_exception();
      throw;
    }
  }

  void exit_scope_nothrow(module_id m, bool is_backward) noexcept {
    try {
      exit_scope(m, is_backward);
    } catch (...) {
      // kept in broken_ by exit_scope (or already there): the next engine call rethrows it
    }
  }

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

  // ---- step helpers --------------------------------------------------------------------------
  struct global_stats {
    double sum_squares;
    bool overflow;
  };
  // All-reduces (sum of squares, overflow flag). The double sum travels as a hi/lo pair of
  // floats so the global norm keeps about 48 bits instead of 24.
  global_stats global_grad_stats() {
    const grad_stats local = offloader_.local_grad_stats();
    const float hi = static_cast<float>(local.sum_squares);
    float msg[3] = {hi, static_cast<float>(local.sum_squares - double(hi)), local.nonfinite ? 1.0f : 0.0f};
    auto& streams = store_.streams();
    buffer<Backend> dev = scratch(dtype::f32, 3);
    backend_.copy(dev.data(), msg, sizeof msg, streams.on(stream_role::compute));
    comm_.all_reduce(dev.data(), dev.data(), 3, dtype::f32, reduce_op::sum, streams.collective_on(stream_role::compute));
    backend_.copy(msg, dev.data(), sizeof msg, streams.on(stream_role::compute));
    backend_.synchronize(streams.on(stream_role::compute));
    const double sum = double(msg[0]) + double(msg[1]);
    return {sum, msg[2] > 0.0f || !std::isfinite(sum)};
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

  Backend& backend_;
  Comm& comm_;
  const model_spec spec_;
  const engine_config cfg_;
  rank_trace* trace_;  // null unless cfg_.trace: before store_, so it sees every allocation
  [[no_unique_address]] partitioner_type partitioner_{};
  std::vector<shard_layout> layouts_;
  param_store<Backend> store_;
  offloader_type offloader_;
  reducer_type reducer_;
  tracker_type tracker_{};
  prefetcher_type prefetcher_{};
  residency<Backend, Comm, prefetcher_type> residency_;
  optim::loss_scaler scaler_;
  float lr_;
  std::int64_t step_ = 0;
  int micro_batches_ = 0;
  int open_scopes_ = 0;
  std::size_t activation_bytes_ = 0;
  std::vector<param_id> completed_;
  std::vector<param_id> ahead_;
  std::vector<swept_use> swept_;
  std::vector<bool> swept_said_;  // modules whose sweep was logged
  std::exception_ptr broken_;
};

}  // namespace zshard

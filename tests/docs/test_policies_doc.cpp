// docs/POLICIES.md's five policies written from scratch, compiled and trained together: the
// engine with all five swapped in equals single-process float64 training (the toy model has a
// tied embedding and a layer used twice, so shared parameters and repeated modules are covered).
// The doc quotes this file; a ctest (docs_policies_in_sync) checks each of its cpp blocks is here verbatim.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "../engine/toy_training.hpp"
#include "neighbour_prefetcher.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/policy_options.hpp"

namespace mine {
using namespace zshard;

// ---- Partitioner ---------------------------------------------------------------------------
// Even shards rounded up to whole 64-byte lines of f32 (16 elements); small parameters whole.
struct line_aligned {
  using zshard_tag = partitioner_tag;
  template <class Backend, class Comm>
  using impl = line_aligned;  // needs neither: names itself

  shard_layout layout(const param_identity& p, int world, const partition_config& cfg) const {
    const std::size_t numel = p.numel();
    if (numel <= cfg.persistence_threshold_numel) return {numel, numel, numel, true};
    const std::size_t w = static_cast<std::size_t>(world);
    const std::size_t shard = ((numel + w - 1) / w + 15) / 16 * 16;
    return {numel, shard, shard * w, false};
  }
};
static_assert(check_partitioner<line_aligned>());

// ---- Prefetcher: neighbour, in neighbour_prefetcher.hpp (the planner's property test runs it too) ----

// ---- Reducer -------------------------------------------------------------------------------
// Reduces each gradient the moment it is complete: no bucket, one collective per parameter.
template <class Backend, class Comm>
class eager_reducer {
 public:
  eager_reducer(param_store<Backend>& store, Comm& comm, const reduce_config&) : store_(store), comm_(comm) {}

  template <class Sink>
  void grad_ready(param_id p, Sink& sink) {
    auto& s = store_[p];
    if (!s.full_grad) return;  // no backward wrote to it this micro-batch
    auto& streams = store_.streams();
    streams.order(stream_role::reduce, stream_role::compute);  // after the kernels that wrote it
    auto& on = streams.on(stream_role::reduce);
    float* full = s.full_grad.template as<float>();
    if (s.layout.replicated) {
      comm_.all_reduce(full, full, s.layout.numel, dtype::f32, reduce_op::average, streams.collective_on(stream_role::reduce));
      sink.accumulate_grad(p, full, s.layout.numel, on);
    } else {
      buffer<Backend> shard(store_.backend(), dtype::f32, s.layout.shard_numel, mem_category::scratch, on);
      comm_.reduce_scatter(full, shard.data(), s.layout.shard_numel, dtype::f32, reduce_op::average,
                           streams.collective_on(stream_role::reduce));
      sink.accumulate_grad(p, shard.template as<float>(), s.layout.shard_numel, on);
      shard.reset_on(on);
    }
    s.full_grad.reset_on(on);  // the full gradient is the Reducer's to free
  }
  template <class Sink>
  void flush(Sink&) {}  // nothing ever waits
  std::size_t pending_numel() const noexcept { return 0; }

 private:
  param_store<Backend>& store_;
  Comm& comm_;
};
struct eager {
  using zshard_tag = reducer_tag;
  template <class Backend, class Comm>
  using impl = eager_reducer<Backend, Comm>;
};

// ---- Offloader -----------------------------------------------------------------------------
// Optimizer state in std::vectors on the host, charged to a host ledger; AdamW as a plain loop.
// Works on any backend: shards and gradients cross with backend.copy on the stream they are on.
template <class Backend, class Comm>
class host_vectors_impl {
 public:
  host_vectors_impl(param_store<Backend>& store, Comm& comm, const optim::adamw_config& hyper, const offload_config&)
      : store_(store), comm_(comm), hyper_(hyper), state_(store.size()) {
    for (param_id p = 0; p < store.size(); ++p) {
      if (!store[p].spec->trainable) continue;
      const std::size_t n = store[p].layout.shard_numel;
      for (auto* v : {&state_[p].master, &state_[p].m, &state_[p].v}) v->assign(n, 0.0f);
      state_[p].grad.assign(n, 0.0f);
      host_.charge(mem_category::optimizer_state, 3 * n * sizeof(float));
      host_.charge(mem_category::grad_shards, n * sizeof(float));
    }
  }
  ~host_vectors_impl() {
    for (param_id p = 0; p < store_.size(); ++p) {
      host_.release(mem_category::optimizer_state, 3 * state_[p].master.size() * sizeof(float));
      host_.release(mem_category::grad_shards, state_[p].grad.size() * sizeof(float));
    }
  }

  void init_param(param_id p, const float* values) {  // values: f32, on the backend, compute stream
    auto& st = state_[p];
    store_.backend().copy(st.master.data(), values, st.master.size() * sizeof(float), compute());
    store_.backend().synchronize(compute());
  }
  void accumulate_grad(param_id p, const float* g, std::size_t n, typename Backend::stream& ready_on) {
    std::vector<float> tmp(n);
    store_.backend().copy(tmp.data(), g, n * sizeof(float), ready_on);  // read g in its stream's order
    store_.backend().synchronize(ready_on);
    for (std::size_t i = 0; i < n; ++i) state_[p].grad[i] += tmp[i];
  }
  grad_stats local_grad_stats() {
    grad_stats total;
    for (param_id p = 0; p < store_.size(); ++p) {
      if (store_[p].layout.replicated && comm_.rank() != 0) continue;  // a replicated value counts once
      for (float g : state_[p].grad) {
        total.sum_squares += double(g) * g;
        total.nonfinite = total.nonfinite || !std::isfinite(g);
      }
    }
    return total;
  }
  void update(const update_args& a) {
    optim::adamw_config hyper = hyper_;
    hyper.lr = a.lr;
    for (param_id p = 0; p < store_.size(); ++p) {
      auto& st = state_[p];
      if (st.grad.empty()) continue;
      auto& slot = store_[p];
      const auto step = optim::make_adamw_step(hyper, a.step, a.grad_scale, slot.spec->decay);
      std::vector<std::byte> working(st.master.size() * size_of(slot.type));
      optim::adamw_update_scalar(step, st.master.data(), st.m.data(), st.v.data(), st.grad.data(), st.master.size(),
                                 working.data(), slot.type);
      store_.backend().copy(slot.shard.data(), working.data(), working.size(), compute());  // the working shard
      store_.backend().synchronize(compute());
      std::fill(st.grad.begin(), st.grad.end(), 0.0f);
    }
  }
  void discard_grads() {
    for (auto& st : state_) std::fill(st.grad.begin(), st.grad.end(), 0.0f);
  }
  const memory_ledger& state_ledger() const noexcept { return host_; }

 private:
  struct param_state {
    std::vector<float> master, m, v, grad;
  };
  typename Backend::stream& compute() noexcept { return store_.streams().on(stream_role::compute); }

  param_store<Backend>& store_;
  Comm& comm_;
  optim::adamw_config hyper_;
  std::vector<param_state> state_;
  memory_ledger host_{"host (optimizer state)"};
};
struct host_vectors {
  using zshard_tag = offloader_tag;
  template <class Backend, class Comm>
  using impl = host_vectors_impl<Backend, Comm>;
};

// ---- HookTracker ---------------------------------------------------------------------------
// Counts per call (I1): a module forwarded twice waits for two backwards; a parameter shared by
// several modules is complete when none of them has a counted use left (I2).
class call_counter {
 public:
  using zshard_tag = hook_tracker_tag;
  template <class Backend, class Comm>
  using impl = call_counter;

  void reset(const model_spec& spec) {
    spec_ = &spec;
    pending_.assign(spec.modules().size(), 0);
    recomputed_.assign(spec.modules().size(), false);
    users_.assign(spec.params().size(), {});
    for (module_id m = 0; m < spec.modules().size(); ++m)
      for (param_id p : spec.module(m).params) users_[p].push_back(m);
    phase_ = step_phase::forward;
  }
  bool on_forward(module_id m, use_kind kind) {
    if (kind == use_kind::recompute) {
      ZSHARD_REQUIRE(phase_ == step_phase::backward, error_kind::usage, "recompute outside backward");
      recomputed_[m] = true;  // held gathered until its backward, which comes next
      return false;
    }
    if (kind == use_kind::no_grad) return false;
    ZSHARD_REQUIRE(phase_ == step_phase::forward, error_kind::usage, "counted forward during backward",
                   "use recompute() or use_kind::no_grad");
    ++pending_[m];
    return true;
  }
  void on_begin_backward() { phase_ = step_phase::backward; }
  void on_backward(module_id m) {
    ZSHARD_REQUIRE(pending_[m] > 0, error_kind::usage,
                   "backward of module '" + spec_->module(m).name + "' without a counted forward");
  }
  void on_backward_done(module_id m, std::vector<param_id>& completed) {
    --pending_[m];
    recomputed_[m] = false;
    for (param_id p : spec_->module(m).params)
      if (spec_->param(p).trainable && none_pending(p)) completed.push_back(p);
  }
  void on_end_backward(std::vector<param_id>& completed, std::vector<swept_use>& swept) {
    std::vector<bool> added(users_.size(), false);
    for (module_id m = 0; m < pending_.size(); ++m) {
      if (pending_[m] == 0) continue;
      swept.push_back({m, pending_[m]});  // I3: reported, reduced and released anyway
      pending_[m] = 0;
      for (param_id p : spec_->module(m).params)
        if (spec_->param(p).trainable && !added[p]) completed.push_back(p), added[p] = true;
    }
    recomputed_.assign(recomputed_.size(), false);
    phase_ = step_phase::forward;
  }
  void on_step() {
    ZSHARD_REQUIRE(phase_ == step_phase::forward, error_kind::usage, "step() inside backward");
  }
  // A recomputed module stays gathered for its backward, but yields to max_live_numel.
  bool keeps_gathered(module_id) const { return false; }
  bool prefers_gathered(module_id m) const { return recomputed_[m]; }
  step_phase phase() const { return phase_; }
  std::int64_t pending_uses(module_id m) const { return pending_[m]; }

 private:
  bool none_pending(param_id p) const {
    return std::all_of(users_[p].begin(), users_[p].end(), [&](module_id u) { return pending_[u] == 0; });
  }
  const model_spec* spec_ = nullptr;
  std::vector<std::int64_t> pending_;
  std::vector<bool> recomputed_;
  std::vector<std::vector<module_id>> users_;  // modules that list each parameter
  step_phase phase_ = step_phase::forward;
};
static_assert(check_hook_tracker<call_counter>());

// ---- all five together ---------------------------------------------------------------------
struct from_scratch : default_policies {
  using partitioner = line_aligned;
  using prefetcher = neighbour;
  using reducer = eager;
  using offloader = host_vectors;
  using hook_tracker = call_counter;
};

}  // namespace mine

TEST_CASE("the five policies written from scratch in docs/POLICIES.md train like single-process float64") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    toy::train_options o;
    o.world = world;
    o.steps = 3;
    o.micro_batches = 2;
    o.engine.adamw.lr = 1e-2f;
    o.engine.partition.persistence_threshold_numel = 8;  // the toy's small gains stay whole
    const auto want = toy::train_reference(o);
    const auto got = toy::train_sharded<mine::from_scratch>(o);
    REQUIRE(got.params.size() == want.params.size());
    for (std::size_t p = 0; p < want.params.size(); ++p)
      for (std::size_t i = 0; i < want.params[p].size(); ++i)
        REQUIRE(got.params[p][i] == doctest::Approx(want.params[p][i]).epsilon(1e-5));
  }
}

// Issue 26: the memory plan of a run with a Prefetcher the planner does not mirror. The
// neighbour gathers ahead whatever prefetch_numel says (0 here: prefetch::trace would gather
// nothing ahead), so a plan made as if the run used prefetch::trace falls below the run; planned
// for these policies (plan_memory_for: the budget bound, plan/policy_options.hpp) it bounds it,
// with the custom Partitioner's layouts and host_adam's host ledger.
struct planned_policies : zshard::default_policies {
  using partitioner = mine::line_aligned;
  using prefetcher = mine::neighbour;
  using offloader = zshard::offload::host_adam;
};

TEST_CASE("the plan for a custom Prefetcher and Partitioner with host_adam bounds their run") {
  using namespace zshard;
  using namespace zshard::plan;
  static_assert(prefetch_policy_of<mine::neighbour>() == prefetch_policy::any);
  static_assert(prefetch_policy_of<prefetch::trace>() == prefetch_policy::trace);
  CHECK(options_for<planned_policies>().optimizer == optimizer_location::host);
  toy::ids id;
  const model_spec spec = toy::make_spec({.vocab = 13, .dim = 24, .layers = 4, .repeat_layer1 = true}, id);
  engine_config cfg;
  cfg.prefetch.prefetch_numel = 0;
  cfg.partition.persistence_threshold_numel = 8;
  cfg.log = [](const std::string&) {};
  std::vector<segment> segments{{{id.embed}}};
  for (module_id m : id.layer) segments.push_back({.modules = {m}, .kept_bytes = 96, .checkpointed = m == id.layer[1]});
  segments.push_back({{id.head}});
  const training_schedule schedule{{training_step(segments, 2)}};
  for (int world : {2, 3}) {
    CAPTURE(world);
    const memory_plan plan = plan_memory_for<planned_policies>(spec, cfg, world, schedule);
    const phantom_result run = run_phantom<planned_policies>(spec, cfg, world, schedule, 3);
    std::ostringstream table;
    print_plan(table, plan, &run.peak_step(), run.host ? &*run.host : nullptr);
    INFO(table.str());
    CHECK(run.peak() <= plan.device.total_peak);
    for (std::size_t k = 0; k < mem_category_count; ++k)
      CHECK(run.peak_step().peak(mem_category(k)) <= plan.device.peak[k]);
    REQUIRE(run.host.has_value());
    CHECK(run.host->total_peak() <= plan.host.total_peak);
    // Planned as if the run used the default Prefetcher: below the run (the finding).
    const memory_plan as_trace =
        plan_memory<mine::line_aligned>(spec, cfg, world, schedule, {.optimizer = optimizer_location::host});
    CHECK(as_trace.device.total_peak < run.peak());
    MESSAGE("world " << world << ": run " << run.peak() << ", plan " << plan.device.total_peak << ", as trace " << as_trace.device.total_peak);
  }
}

#pragma once
// The memory planner: each rank's peak memory by ledger category, computed before anything
// runs from the model, the engine config, the world size, where the optimizer state lives and
// the step's schedule with its activations (plan/step_schedule.hpp). It walks the scopes of a
// step in the order the engine sees them and charges a ledger with what the engine and its
// default policies allocate at each point, so the result reads like the ledger of a real run:
// a peak per category, the total peak, the categories at that moment and the phase it
// happened in. Under the even partitioner every rank is the same, so one walk is every rank.
//
// The terms, and where they come from (per rank; shard = ceil(numel / world) rounded up to
// partition.shard_alignment_numel, padded = shard · world, e = bytes of the working dtype):
//  - sharded_params   Σ shard·e over all parameters (param_store: whole value for replicated
//                     ones), for the whole run.
//  - optimizer_state  on device (offload::on_device): 3 · 4 · Σ shard of trainable parameters
//                     (f32 master, m, v), for the whole run; host_adam: 0 here.
//  - grad_shards      on device: 4 · Σ shard (f32, accumulated over micro-batches); host: 0 here.
//  - gathered_params  in a scope of module m: m's own parameters, padded·e each (replicated
//                     ones excluded: never gathered). With the trace Prefetcher (the default),
//                     also what it can hold then: the parameters of the scopes that follow
//                     within prefetch_numel (its window, module by module, as it requests them)
//                     and those kept for reuse (next use within max_reuse_distance), admitted
//                     in order while own + held <= max_live_numel, the engine's rule for
//                     gathering ahead (I5) and for evicting to fit a scope. It is an upper
//                     bound: the recording first step prefetches nothing, and a tight budget
//                     admits less. On-demand: own parameters only; they are freed when the
//                     scope closes. Modules larger than max_live_numel are a configuration
//                     error unless allow_oversized_module, as in the engine.
//  - grad_buckets     f32 full gradients, padded·4, allocated for every trainable parameter of
//                     m at entry of m's backward scope, freed one by one as the Reducer
//                     reduce-scatters them. The Reducer's rule is replayed exactly: a gradient
//                     that would overflow reduce_bucket_numel flushes the bucket first, a full
//                     bucket flushes at once, end_backward flushes the rest; a shared parameter
//                     is ready after the backward of its last counted use. So the term at a
//                     backward entry is m's gradients plus what the bucket carries over.
//  - scratch          the reduce-scatter's output, shard·4, alive while one parameter is
//                     reduced (the largest such term); on a backend that holds storage the
//                     engine's initialisation also stages each shard's initial values as f32
//                     (the largest shard) and checks the model across ranks (2 + 2·world f32);
//                     step() all-reduces 3 floats. Not planned: gather_param() (a tool for
//                     tests and checkpoints, outside training).
//  - activations      whatever the schedule's protocol reports (step_schedule.hpp).
//  Host ledger (optimizer on the host, offload::host_adam): optimizer_state 3 · 4 · Σ s and
//  grad_shards 4 · Σ s, s = shard rounded up to the host AdamW's tile granule, plus two
//  staging halves of host_staging_numel f32 when the backend's memory is a device's.
#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/memory_ledger.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/optim/adamw_dispatch.hpp"
#include "zshard/partition/even_partitioner.hpp"
#include "zshard/plan/step_schedule.hpp"

namespace zshard::plan {

enum class optimizer_location { device, host };   // offload::on_device / offload::host_adam
enum class prefetch_policy { on_demand, trace };  // prefetch::on_demand / prefetch::trace (default)

struct plan_options {
  optimizer_location optimizer = optimizer_location::device;
  prefetch_policy prefetcher = prefetch_policy::trace;
  // host_adam's staging (offload_config::host_staging_numel) when the backend's memory is not
  // host memory (CUDA); 0 for the host and phantom backends, which stage nothing.
  std::size_t host_staging_numel = 0;
  // The engine's construction on a backend that holds storage (initial values staged as f32).
  // A phantom backend skips it; the figure equals the largest reduce scratch when every
  // parameter is trainable, so leaving it on is harmless there.
  bool initialization = true;
};

// One ledger's predicted peaks, laid out like memory_ledger's.
struct ledger_plan {
  std::string name;
  std::array<std::size_t, mem_category_count> peak{};           // per category, each at its own time
  std::array<std::size_t, mem_category_count> at_total_peak{};  // per category when the total peaked
  std::size_t total_peak = 0;
  std::string peak_phase;  // where the total peaked, e.g. "backward of head: reduce-scatter of head.weight"

  std::size_t peak_of(mem_category c) const noexcept { return peak[static_cast<std::size_t>(c)]; }
  std::size_t at_peak_of(mem_category c) const noexcept { return at_total_peak[static_cast<std::size_t>(c)]; }
};

struct memory_plan {
  int world = 1;
  ledger_plan device;                  // the backend's ledger
  ledger_plan host;                    // host_adam's ledger (offloaded state); empty with the optimizer on device
  std::size_t max_gathered_numel = 0;  // resident gathered elements at most (the I5 figure)
  bool fits(std::size_t device_bytes) const noexcept { return device.total_peak <= device_bytes; }
};

namespace detail {

class plan_walk {
 public:
  plan_walk(const model_spec& spec, const engine_config& cfg, int world, std::vector<shard_layout> layouts,
            const step_schedule& schedule, const plan_options& opt)
      : spec_(spec), cfg_(cfg), world_(world), layouts_(std::move(layouts)), schedule_(schedule), opt_(opt) {
    module_numel_.assign(spec.modules().size(), 0);
    for (module_id m = 0; m < spec.modules().size(); ++m) {
      for (param_id p : spec.module(m).params)
        if (!layouts_[p].replicated) module_numel_[m] += layouts_[p].padded_numel;
      ZSHARD_REQUIRE(
          module_numel_[m] <= cfg.prefetch.max_live_numel || cfg.prefetch.allow_oversized_module, error_kind::config,
          "module '" + spec.module(m).name + "' needs " + std::to_string(module_numel_[m]) +
              " gathered elements, more than max_live_numel = " + std::to_string(cfg.prefetch.max_live_numel),
          "raise max_live_numel, split the module, or set allow_oversized_module");
    }
    build_trace();
    full_grad_.assign(spec.params().size(), false);
    uses_.assign(spec.params().size(), 0);
    stamp_.assign(spec.params().size(), ~std::size_t{0});
  }

  memory_plan run() {
    memory_plan out;
    out.world = world_;
    constant_terms();
    for (std::size_t k = 0; k < trace_.size(); ++k) visit(k);
    phase_ = "step";
    charge(mem_category::scratch, 3 * sizeof(float));  // global gradient statistics
    ledger_.release(mem_category::scratch, 3 * sizeof(float));
    out.device = result("device");
    out.host = host_plan();
    out.max_gathered_numel = max_gathered_numel_;
    return out;
  }

 private:
  enum class kind { forward, recompute, backward };
  struct scope_entry {
    module_id module;
    kind what;
    std::size_t step_index;  // into schedule_.modules
    int micro_batch;
  };

  std::size_t elem(param_id p) const { return size_of(spec_.param(p).type.value_or(cfg_.param_dtype)); }
  bool trainable(param_id p) const { return spec_.param(p).trainable; }

  // The scopes of a whole step, as the trace Prefetcher records them.
  void build_trace() {
    const auto& mods = schedule_.modules;
    for (int mb = 0; mb < schedule_.micro_batches; ++mb) {
      for (std::size_t i = 0; i < mods.size(); ++i) trace_.push_back({mods[i].module, kind::forward, i, mb});
      for (std::size_t i = mods.size(); i-- > 0;) {
        if (mods[i].recomputed) trace_.push_back({mods[i].module, kind::recompute, i, mb});
        trace_.push_back({mods[i].module, kind::backward, i, mb});
      }
    }
    prefix_.assign(trace_.size() + 1, 0);
    for (std::size_t k = 0; k < trace_.size(); ++k) prefix_[k + 1] = prefix_[k] + module_numel_[trace_[k].module];
    if (opt_.prefetcher != prefetch_policy::trace) return;
    plan_window();
    if (cfg_.prefetch.max_reuse_distance > 0) plan_reuse();
  }

  // The trace Prefetcher's window: greedy, scope by scope, within prefetch_numel.
  void plan_window() {
    const std::size_t n = trace_.size();
    window_end_.assign(n, 0);
    requested_at_.assign(n, n);
    uses_of_.assign(spec_.params().size(), {});
    seen_.assign(spec_.params().size(), ~std::size_t{0});
    for (std::size_t k = 0, end = 1; k < n; ++k) {
      end = std::max(end, k + 1);
      while (end < n && prefix_[end + 1] - prefix_[k + 1] <= cfg_.prefetch.prefetch_numel) ++end;
      window_end_[k] = end;
      for (param_id p : spec_.module(trace_[k].module).params)
        if (!layouts_[p].replicated) uses_of_[p].push_back(k);
    }
    for (std::size_t k = 0, j = 1; k < n; ++k)
      for (j = std::max(j, k + 1); j < window_end_[k]; ++j) requested_at_[j] = k;
  }

  // keep_after_scope: p stays gathered from a use at j to its next use at j' when the scopes
  // in between hold at most max_reuse_distance elements.
  void plan_reuse() {
    kept_at_.assign(trace_.size(), {});
    std::vector<std::size_t> last(spec_.params().size(), ~std::size_t{0});
    for (std::size_t k = 0; k < trace_.size(); ++k) {
      for (param_id p : spec_.module(trace_[k].module).params) {
        if (layouts_[p].replicated) continue;
        const std::size_t j = last[p];
        last[p] = k;
        if (j == ~std::size_t{0} || prefix_[k] - prefix_[j + 1] > cfg_.prefetch.max_reuse_distance) continue;
        for (std::size_t i = j + 1; i < k; ++i) kept_at_[i].push_back(p);
      }
    }
  }

  void constant_terms() {
    phase_ = "initialization";
    std::size_t sharded = 0, trainable_shards = 0, largest_shard = 0;
    for (param_id p = 0; p < spec_.params().size(); ++p) {
      sharded += layouts_[p].shard_numel * elem(p);
      largest_shard = std::max(largest_shard, layouts_[p].shard_numel);
      if (trainable(p)) trainable_shards += layouts_[p].shard_numel;
    }
    charge(mem_category::sharded_params, sharded);
    if (opt_.optimizer == optimizer_location::device) {
      charge(mem_category::optimizer_state, 3 * 4 * trainable_shards);
      charge(mem_category::grad_shards, 4 * trainable_shards);
    }
    if (opt_.initialization) {
      const std::size_t check = (2 + 2 * std::size_t(world_)) * 4, staging = 4 * largest_shard;
      charge(mem_category::scratch, std::max(check, staging));
      ledger_.release(mem_category::scratch, std::max(check, staging));
    }
  }

  void visit(std::size_t k) {
    const scope_entry& s = trace_[k];
    const module_step& ms = schedule_.modules[s.step_index];
    const auto& params = spec_.module(s.module).params;
    static constexpr const char* names[] = {"forward", "recompute", "backward"};
    phase_ = std::string(names[int(s.what)]) + " of " + spec_.module(s.module).name + batch_suffix(s.micro_batch);
    set(mem_category::gathered_params, gathered_bytes(k));
    switch (s.what) {
      case kind::forward:
        for (param_id p : params)
          if (trainable(p)) ++uses_[p];
        set(mem_category::activations, activations_ += ms.kept_bytes);
        break;
      case kind::recompute:
        set(mem_category::activations, activations_ += ms.recompute_bytes);
        break;
      case kind::backward: {
        for (param_id p : params) {
          if (!trainable(p) || full_grad_[p]) continue;
          full_grad_[p] = true;
          charge(mem_category::grad_buckets, 4 * layouts_[p].padded_numel);
        }
        const std::string scope_phase = phase_;
        for (param_id p : params)  // the tracker's completion order: the module's own order
          if (trainable(p) && --uses_[p] == 0) grad_ready(p, scope_phase);
        phase_ = scope_phase;
        set(mem_category::activations, activations_ -= ms.kept_bytes + ms.recompute_bytes);
        const bool last_of_batch = k + 1 == trace_.size() || trace_[k + 1].micro_batch != s.micro_batch;
        if (last_of_batch) end_backward(s.micro_batch);
        break;
      }
    }
  }

  // Resident gathered bytes in scope k: own parameters, then what the trace Prefetcher holds.
  std::size_t gathered_bytes(std::size_t k) {
    std::size_t numel = 0, bytes = 0;
    auto take = [&](param_id p, bool own) {
      if (layouts_[p].replicated || stamp_[p] == k) return;
      const std::size_t n = layouts_[p].padded_numel;
      if (!own && numel + n > cfg_.prefetch.max_live_numel) return;  // not admitted (I5)
      stamp_[p] = k;
      numel += n;
      bytes += n * elem(p);
    };
    for (param_id p : spec_.module(trace_[k].module).params) take(p, true);
    if (opt_.prefetcher == prefetch_policy::trace) {
      if (!kept_at_.empty())
        for (param_id p : kept_at_[k]) take(p, false);
      for (param_id p : prefetched(k)) take(p, false);
    }
    max_gathered_numel_ = std::max(max_gathered_numel_, numel);
    return bytes;
  }

  // The window of scope k is the scopes (k, window_end_[k]): as many as fit in prefetch_numel.
  // A parameter p used in it was requested when its last use there, j, entered the window (at
  // scope requested_at_[j]), and is still resident unless some use of p since then released it.
  std::vector<param_id> prefetched(std::size_t k) {
    ahead_.clear();
    for (std::size_t j = window_end_[k]; j-- > k + 1;) {
      for (param_id p : spec_.module(trace_[j].module).params) {
        if (layouts_[p].replicated || seen_[p] == k) continue;
        seen_[p] = k;  // j is p's last use in the window
        const auto& u = uses_of_[p];
        auto after = std::upper_bound(u.begin(), u.end(), k);  // p's first use after k
        const bool used_since_request = after != u.begin() && *(after - 1) >= requested_at_[j];
        if (!used_since_request) ahead_.push_back(p);
      }
    }
    std::reverse(ahead_.begin(), ahead_.end());  // roughly the order the engine gathered them
    return ahead_;
  }

  void grad_ready(param_id p, const std::string& scope_phase) {
    const std::size_t n = layouts_[p].padded_numel;
    if (!pending_.empty() && pending_numel_ + n > cfg_.reduce.reduce_bucket_numel) flush(scope_phase);
    pending_.push_back(p);
    pending_numel_ += n;
    if (pending_numel_ >= cfg_.reduce.reduce_bucket_numel) flush(scope_phase);
  }

  void flush(const std::string& where) {
    for (param_id p : pending_) {
      phase_ = where + ": reduce-scatter of " + spec_.param(p).name;
      if (!layouts_[p].replicated) {  // replicated: all-reduced in place, no output buffer
        charge(mem_category::scratch, 4 * layouts_[p].shard_numel);
        ledger_.release(mem_category::scratch, 4 * layouts_[p].shard_numel);
      }
      ledger_.release(mem_category::grad_buckets, 4 * layouts_[p].padded_numel);
      full_grad_[p] = false;
    }
    pending_.clear();
    pending_numel_ = 0;
  }

  // The tracker's sweep finds nothing in a well-formed schedule; the Reducer flushes the rest
  // with the last scope's prefetched parameters still resident, then everything is released.
  void end_backward(int micro_batch) {
    flush("end of backward" + batch_suffix(micro_batch));
    set(mem_category::gathered_params, 0);
  }

  std::string batch_suffix(int micro_batch) const {
    return schedule_.micro_batches > 1 ? " (micro-batch " + std::to_string(micro_batch + 1) + ")" : std::string();
  }

  void charge(mem_category c, std::size_t bytes) {
    ledger_.charge(c, bytes);
    if (ledger_.total_peak() > peak_seen_) {
      peak_seen_ = ledger_.total_peak();
      peak_phase_ = phase_;
    }
  }
  void set(mem_category c, std::size_t bytes) {
    const std::size_t now = ledger_.current(c);
    if (bytes > now)
      charge(c, bytes - now);
    else
      ledger_.release(c, now - bytes);
  }

  ledger_plan result(const std::string& name) const {
    ledger_plan r;
    r.name = name;
    for (std::size_t i = 0; i < mem_category_count; ++i) {
      r.peak[i] = ledger_.peak(mem_category(i));
      r.at_total_peak[i] = ledger_.at_total_peak(mem_category(i));
    }
    r.total_peak = ledger_.total_peak();
    r.peak_phase = peak_phase_;
    return r;
  }

  ledger_plan host_plan() const {
    ledger_plan r;
    r.name = "host";
    if (opt_.optimizer != optimizer_location::host) return r;
    std::size_t n = 0;
    for (param_id p = 0; p < spec_.params().size(); ++p)
      if (trainable(p)) n += optim::round_up_to_granule(layouts_[p].shard_numel);
    auto put = [&r](mem_category c, std::size_t bytes) {
      r.peak[std::size_t(c)] = r.at_total_peak[std::size_t(c)] = bytes;
      r.total_peak += bytes;
    };
    put(mem_category::optimizer_state, 3 * 4 * n);
    put(mem_category::grad_shards, 4 * n);
    put(mem_category::scratch, 2 * 4 * opt_.host_staging_numel);
    r.peak_phase = "construction (held for the whole run)";
    return r;
  }

  const model_spec& spec_;
  const engine_config& cfg_;
  const int world_;
  const std::vector<shard_layout> layouts_;
  const step_schedule& schedule_;
  const plan_options opt_;
  std::vector<std::size_t> module_numel_;  // gathered elements per module (replicated excluded)
  std::vector<scope_entry> trace_;
  std::vector<std::size_t> prefix_;                // prefix_[k]: elements of scopes before k
  std::vector<std::vector<param_id>> kept_at_;     // kept for reuse while scope k runs
  std::vector<std::size_t> window_end_;            // scope k prefetches scopes (k, window_end_[k])
  std::vector<std::size_t> requested_at_;          // the scope whose window first reached scope j
  std::vector<std::vector<std::size_t>> uses_of_;  // scopes that use a parameter, in order
  std::vector<std::size_t> seen_;                  // last scope whose window counted a parameter
  std::vector<param_id> ahead_;
  std::vector<bool> full_grad_;
  std::vector<std::int64_t> uses_;  // counted uses whose backward has not run
  std::vector<std::size_t> stamp_;  // last scope a parameter was counted in
  std::vector<param_id> pending_;
  std::size_t pending_numel_ = 0;
  std::size_t activations_ = 0;
  std::size_t max_gathered_numel_ = 0;
  memory_ledger ledger_{"device (plan)"};
  std::string phase_;
  std::string peak_phase_;
  std::size_t peak_seen_ = 0;
};

}  // namespace detail

// The plan for `schedule` on each rank of a world of `world` ranks under Partitioner's layout.
template <class Partitioner = partition::even>
memory_plan plan_memory(const model_spec& spec, const engine_config& cfg, int world, const step_schedule& schedule,
                        const plan_options& opt = {}) {
  ZSHARD_REQUIRE(world >= 1, error_kind::config, "world size must be at least 1, got " + std::to_string(world));
  spec.validate();
  cfg.validate();
  schedule.validate(spec);
  const Partitioner partitioner{};
  std::vector<shard_layout> layouts;
  layouts.reserve(spec.params().size());
  for (const auto& p : spec.params()) layouts.push_back(partitioner.layout(p.numel(), world, cfg.partition));
  return detail::plan_walk(spec, cfg, world, std::move(layouts), schedule, opt).run();
}

}  // namespace zshard::plan

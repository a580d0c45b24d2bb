#pragma once
// Random models, configs and training schedules for the planner's property test: shared and
// replicated parameters, mixed dtypes, frozen parameters, modules used several times, nested
// scopes, checkpointed segments, no-grad passes (inside a step and every few steps),
// gather_param and exports, gradient accumulation, world 1..8, tight and loose budgets; and what
// a run does beside its schedule (issue 26): modules larger than max_live_numel
// (allow_oversized_module) with reuse, keep-gathered and recompute holds, check_every_scope,
// no-sync accumulation (set_gradient_sync), parameters frozen at registration unfrozen in
// stages (set_trainable), and Prefetchers the planner does not mirror.
#include <algorithm>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/plan_result.hpp"
#include "zshard/plan/schedule_builder.hpp"
#include "zshard/prefetch/prefetcher.hpp"
#include "../docs/neighbour_prefetcher.hpp"

namespace plan_test {

using namespace zshard;
using namespace zshard::plan;

// Prefetchers the planner does not mirror (planned with prefetch_policy::any).
// The neighbouring module in the direction of travel (docs/POLICIES.md's example).
using mine::neighbour;

// The worst a Prefetcher can do to memory within the budget: asks for every parameter at every
// scope (starting from a different one each time) and keeps all of them.
struct hoarder {
  using zshard_tag = prefetcher_tag;
  template <class, class>
  using impl = hoarder;
  void reset(const model_spec& spec, const std::vector<shard_layout>&, const prefetch_config&, const log_sink&) {
    n_ = spec.params().size();
  }
  void on_scope_enter(module_id, use_kind, std::vector<param_id>& ahead) {
    for (std::size_t i = 0; i < n_; ++i) ahead.push_back(param_id((i + turn_) % n_));
    ++turn_;
  }
  bool keep_after_scope(param_id) const { return true; }
  void on_step() {}

 private:
  std::size_t n_ = 0, turn_ = 0;
};
static_assert(check_prefetcher<hoarder>());

enum class custom_prefetcher { none, neighbour, hoarder };

struct random_case {
  model_spec spec;
  engine_config cfg;
  int world = 1;
  training_schedule schedule;
  bool simple = false;  // one sequential program, nothing nested, no-grad or reused, loose budgets
  // Beside the schedule: what the plan is told (keep-gathered modules, no-sync, unfreezing, the
  // Prefetcher's kind) and what the run does accordingly.
  plan_options options{.initialization = false};
  custom_prefetcher prefetcher = custom_prefetcher::none;
  std::vector<std::pair<int, std::vector<std::string>>> unfreeze{};  // before step k (0-based), these
  bool budget_below_need = false;  // max_live_numel chosen below what nested scopes need
};

class case_generator {
 public:
  explicit case_generator(std::uint64_t seed) : rng_(seed) {}

  random_case next(bool simple) {
    random_case c;
    c.simple = simple;
    c.world = pick(1, 8);
    const int nparams = pick(1, 10), nmodules = pick(1, 6);
    std::vector<std::size_t> numel;
    for (int p = 0; p < nparams; ++p) {
      param_options o;
      const int t = pick(0, 3);
      if (t == 1) o.type = dtype::bf16;
      if (t == 2) o.type = dtype::f32;
      o.trainable = pick(0, 9) > 0;
      numel.push_back(std::size_t(pick(1, 3) == 1 ? pick(1, 16) : pick(1, 700)));
      c.spec.add_param("p" + std::to_string(p), {std::int64_t(numel.back())}, o);
    }
    // Each module takes a few parameters; some parameters are shared by several modules.
    std::vector<std::vector<param_id>> lists(static_cast<std::size_t>(nmodules));
    for (param_id p = 0; p < param_id(nparams); ++p) {
      lists[std::size_t(pick(0, nmodules - 1))].push_back(p);
      if (!simple && pick(0, 4) == 0) {
        auto& l = lists[std::size_t(pick(0, nmodules - 1))];
        if (std::find(l.begin(), l.end(), p) == l.end()) l.push_back(p);
      }
    }
    std::vector<module_id> usable;
    for (int m = 0; m < nmodules; ++m) {
      c.spec.add_module("m" + std::to_string(m), lists[std::size_t(m)]);
      usable.push_back(module_id(m));
    }
    c.cfg.param_dtype = pick(0, 1) ? dtype::bf16 : dtype::f32;
    c.cfg.partition.shard_alignment_numel = pick(0, 2) ? 1 : 4;
    c.cfg.partition.persistence_threshold_numel = pick(0, 2) ? 0 : 16;
    c.cfg.log = [](const std::string&) {};

    // Some models report no activations: then small terms (the ranks' checks, a reduce-scatter's
    // output) can make the peak, and the plan must have them too.
    activations_ = simple || pick(0, 7) > 0;
    const int programs = simple ? 1 : pick(1, 3);
    for (int i = 0; i < programs; ++i) c.schedule.cycle.push_back(program(c, usable, simple, i));

    // Budgets, from what the schedule needs: the most elements its open scopes pin at once
    // when more than one module is open (a budget below that is refused by the planner and the
    // engine alike, so it is chosen on purpose only now and then).
    std::size_t total = 0, largest = 0;
    for (module_id m = 0; m < c.spec.modules().size(); ++m) largest = std::max(largest, module_numel(c, m));
    for (std::size_t n : numel) total += padded(n, c);
    const bool tight = !simple && pick(0, 1);
    if (tight) {
      c.budget_below_need = pick(0, 9) == 0;
      const std::size_t need = c.budget_below_need ? 0 : nested_need(c);
      const std::size_t lo = std::max<std::size_t>({1, need, largest / 2});
      c.cfg.prefetch.max_live_numel = std::size_t(pick(int(lo), int(std::max(lo, largest + total / 2))));
    } else {
      c.cfg.prefetch.max_live_numel = 4 * total + 8;
    }
    c.cfg.prefetch.allow_oversized_module = c.cfg.prefetch.max_live_numel < largest || pick(0, 3) == 0;
    c.cfg.prefetch.prefetch_numel = std::size_t(pick(0, int(total)));
    c.cfg.prefetch.max_reuse_distance = pick(0, 2) ? 0 : std::size_t(pick(1, int(total) + 1));
    c.cfg.reduce.reduce_bucket_numel = std::size_t(pick(1, int(total + 1)));
    if (simple) {
      c.options.frozen_params_stay_frozen = true;  // simple: the plan is compared within 5%
      return c;
    }
    controls(c, usable);
    return c;
  }

 private:
  int pick(int lo, int hi) { return hi <= lo ? lo : std::uniform_int_distribution<int>(lo, hi)(rng_); }

  static std::size_t padded(std::size_t n, const random_case& c) {
    if (n <= c.cfg.partition.persistence_threshold_numel) return 0;  // replicated: never gathered
    const std::size_t w = std::size_t(c.world), a = c.cfg.partition.shard_alignment_numel;
    return ((n + w - 1) / w + a - 1) / a * a * w;
  }
  static std::size_t param_numel(const random_case& c, param_id p) {
    return padded(std::size_t(c.spec.param(p).shape.numel()), c);
  }
  static std::size_t module_numel(const random_case& c, module_id m) {
    std::size_t n = 0;
    for (param_id p : c.spec.module(m).params) n += param_numel(c, p);
    return n;
  }

  // The most gathered elements the schedule's open scopes pin at once, over the moments when
  // more than one module's scope is open (one module alone may be oversized).
  static std::size_t nested_need(const random_case& c) {
    std::size_t need = 0;
    for (const auto& prog : c.schedule.cycle) {
      std::vector<module_id> open;
      for (const auto& e : prog.events) {
        if (e.kind == event_kind::close) {
          open.erase(std::find(open.begin(), open.end(), e.module));
        } else if (e.kind == event_kind::open) {
          open.push_back(e.module);
          std::vector<bool> seen(c.spec.params().size(), false);
          std::size_t n = 0;
          bool several = false;
          for (module_id m : open) {
            several = several || m != e.module;
            for (param_id p : c.spec.module(m).params)
              if (!seen[p]) seen[p] = true, n += param_numel(c, p);
          }
          if (several) need = std::max(need, n);
        }
      }
    }
    return need;
  }

  step_program program(const random_case& c, const std::vector<module_id>& modules, bool simple, int index) {
    program_builder b("program" + std::to_string(index));
    const int micro_batches = pick(1, 3);
    if (!simple && pick(0, 3) == 0) b.no_grad_pass(some(modules), bytes(5000));
    for (int mb = 0; mb < micro_batches; ++mb) {
      std::vector<segment> segs;
      const int n = simple ? int(modules.size()) : pick(1, 5);
      for (int s = 0; s < n; ++s) {
        segment seg;
        if (simple) {
          seg.modules = {modules[std::size_t(s)]};
        } else {
          const int k = pick(1, 3);
          for (int j = 0; j < k; ++j) seg.modules.push_back(modules[std::size_t(pick(0, int(modules.size()) - 1))]);
          // A parent encloses the segment's scopes: another module (a module's backward scope
          // inside its own open backward scope is refused, by the planner and the engine).
          if (pick(0, 4) == 0) {
            const module_id parent = modules[std::size_t(pick(0, int(modules.size()) - 1))];
            if (std::find(seg.modules.begin(), seg.modules.end(), parent) == seg.modules.end()) seg.parent = parent;
          }
        }
        seg.kept_bytes = bytes(4000);
        seg.checkpointed = pick(0, 1);
        if (seg.checkpointed) seg.recompute_bytes = bytes(6000);
        segs.push_back(seg);
      }
      b.micro_batch(segs);
      if (!simple && pick(0, 5) == 0) b.gather_param(param_id(pick(0, int(c.spec.params().size()) - 1)));
    }
    if (!simple && pick(0, 5) == 0) b.no_grad_pass(some(modules), bytes(5000));
    if (!simple && pick(0, 9) == 0) b.export_params();
    return b.build();
  }

  std::size_t bytes(int most) { return activations_ ? std::size_t(pick(0, most)) : 0; }

  std::vector<module_id> some(const std::vector<module_id>& modules) {
    std::vector<module_id> r;
    const int n = pick(1, int(modules.size()) + 1);
    for (int i = 0; i < n; ++i) r.push_back(modules[std::size_t(pick(0, int(modules.size()) - 1))]);
    return r;
  }

  // What the run does beside its schedule, and what the plan is told of it.
  void controls(random_case& c, const std::vector<module_id>& modules) {
    c.cfg.check_every_scope = pick(0, 3) == 0;
    c.options.no_sync = pick(0, 3) == 0;
    if (pick(0, 3) == 0)
      for (int i = pick(1, 2); i-- > 0;) {
        const std::string name = c.spec.module(modules[std::size_t(pick(0, int(modules.size()) - 1))]).name;
        auto& keep = c.options.keep_gathered_until_backward;
        if (std::find(keep.begin(), keep.end(), name) == keep.end()) keep.push_back(name);
      }
    const int p = pick(0, 5);
    c.prefetcher = p == 0 ? custom_prefetcher::neighbour : p == 1 ? custom_prefetcher::hoarder : custom_prefetcher::none;
    if (c.prefetcher != custom_prefetcher::none) c.options.prefetcher = prefetch_policy::any;
    std::vector<std::string> frozen;
    for (const auto& q : c.spec.params())
      if (!q.trainable) frozen.push_back(q.name);
    if (frozen.empty()) return;
    switch (pick(0, 3)) {
      case 0:  // the plan is told none is ever unfrozen, and none is
        c.options.frozen_params_stay_frozen = true;
        break;
      case 1:  // the default plan; the run unfreezes all of them at some step
        c.unfreeze.push_back({pick(0, 3), frozen});
        break;
      case 2:  // the default plan; the run never unfreezes
        break;
      default: {  // stages, as the run unfreezes them
        const std::size_t split = std::size_t(pick(1, int(frozen.size())));
        std::vector<std::vector<std::string>> stages{{frozen.begin(), frozen.begin() + std::ptrdiff_t(split)}};
        if (split < frozen.size()) stages.emplace_back(frozen.begin() + std::ptrdiff_t(split), frozen.end());
        c.options.unfreeze_stages = stages;
        int at = pick(0, 2);
        for (const auto& s : stages) {
          c.unfreeze.push_back({at, s});
          at += pick(1, 3);
        }
      }
    }
  }

  std::mt19937_64 rng_;
  bool activations_ = true;  // the model being generated reports activations
};

}  // namespace plan_test

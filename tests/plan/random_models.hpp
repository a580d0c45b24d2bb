#pragma once
// Random models, configs and training schedules for the planner's property test: shared and
// replicated parameters, mixed dtypes, frozen parameters, modules used several times, nested
// scopes, checkpointed segments, no-grad passes (inside a step and every few steps),
// gather_param and exports, gradient accumulation, world 1..8, tight and loose budgets.
#include <algorithm>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/schedule_builder.hpp"

namespace plan_test {

using namespace zshard;
using namespace zshard::plan;

struct random_case {
  model_spec spec;
  engine_config cfg;
  int world = 1;
  training_schedule schedule;
  bool simple = false;  // one sequential program, nothing nested, no-grad or reused, loose budgets
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
    std::size_t total = 0, largest = 0;
    for (const auto& m : c.spec.modules()) {
      std::size_t n = 0;
      for (param_id p : m.params) n += padded(numel[p], c);
      largest = std::max(largest, n);
    }
    for (std::size_t n : numel) total += padded(n, c);
    const bool tight = !simple && pick(0, 1);
    c.cfg.prefetch.max_live_numel =
        tight ? std::max<std::size_t>(1, std::size_t(pick(int(largest / 2), int(largest + total / 2)))) : 4 * total + 8;
    c.cfg.prefetch.allow_oversized_module = c.cfg.prefetch.max_live_numel < largest || pick(0, 3) == 0;
    c.cfg.prefetch.prefetch_numel = std::size_t(pick(0, int(total)));
    c.cfg.prefetch.max_reuse_distance = pick(0, 2) ? 0 : std::size_t(pick(1, int(total)));
    c.cfg.reduce.reduce_bucket_numel = std::size_t(pick(1, int(total + 1)));
    c.cfg.log = [](const std::string&) {};

    const int programs = simple ? 1 : pick(1, 3);
    for (int i = 0; i < programs; ++i) c.schedule.cycle.push_back(program(c, usable, simple, i));
    return c;
  }

 private:
  int pick(int lo, int hi) { return hi <= lo ? lo : std::uniform_int_distribution<int>(lo, hi)(rng_); }

  static std::size_t padded(std::size_t n, const random_case& c) {
    if (n <= c.cfg.partition.persistence_threshold_numel) return 0;  // replicated: never gathered
    const std::size_t w = std::size_t(c.world), a = c.cfg.partition.shard_alignment_numel;
    return ((n + w - 1) / w + a - 1) / a * a * w;
  }

  step_program program(const random_case& c, const std::vector<module_id>& modules, bool simple, int index) {
    program_builder b("program" + std::to_string(index));
    const int micro_batches = pick(1, 3);
    if (!simple && pick(0, 3) == 0) b.no_grad_pass(some(modules), std::size_t(pick(0, 5000)));
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
          if (pick(0, 4) == 0) seg.parent = modules[std::size_t(pick(0, int(modules.size()) - 1))];
        }
        seg.kept_bytes = std::size_t(pick(0, 4000));
        seg.checkpointed = pick(0, 1);
        if (seg.checkpointed) seg.recompute_bytes = std::size_t(pick(0, 6000));
        segs.push_back(seg);
      }
      b.micro_batch(segs);
      if (!simple && pick(0, 5) == 0) b.gather_param(param_id(pick(0, int(c.spec.params().size()) - 1)));
    }
    if (!simple && pick(0, 5) == 0) b.no_grad_pass(some(modules), std::size_t(pick(0, 5000)));
    if (!simple && pick(0, 9) == 0) b.export_params();
    return b.build();
  }

  std::vector<module_id> some(const std::vector<module_id>& modules) {
    std::vector<module_id> r;
    const int n = pick(1, int(modules.size()) + 1);
    for (int i = 0; i < n; ++i) r.push_back(modules[std::size_t(pick(0, int(modules.size()) - 1))]);
    return r;
  }

  std::mt19937_64 rng_;
};

}  // namespace plan_test

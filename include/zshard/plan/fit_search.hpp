#pragma once
// zshard_plan --fit: the fastest configuration that fits, chosen before the run. The search
// covers the stage, where the optimizer state lives (device, host, NVMe), where the parameter
// shards live (device, host), the hybrid shard group, the prefetch, live and bucket budgets,
// micro-batch x accumulation for the global batch, and activation checkpointing (none, every
// block, every k-th); every candidate that could be the answer is planned (plan/memory_plan.hpp),
// and those that fit are ranked by the time model (plan/fit_time_model.hpp).
//
// What is ruled out, and why, is exact: a candidate is out only when its own plan exceeds the
// machine, or when a floor that every plan of it reaches already does:
//  - the family floor (plan/fit_candidate.hpp: stage, tiers, shard group): its plan of a minimal
//    step gives the terms held for the whole run (sharded_params, optimizer_state, grad_shards on
//    the device; the host ledger and the NVMe files, which no step changes), so a family whose
//    host ledger exceeds the node's memory, whose NVMe files exceed its drives, or whose device
//    terms alone exceed the device is out, with the term that rules it out;
//  - the activation floor: at the program's largest activation report the device holds those
//    bytes beside the family's device terms, so a step shape whose largest report does not fit
//    beside them is out.
// Candidates that pass both are planned in the order of a lower bound of their step time (the
// time model on byte counts no plan goes below); once the best `top` fitting candidates are
// known and the next lower bound is slower than all of them, the rest are not planned: none of
// them can be among the fastest. `exhaustive` plans them all.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/plan/fit_candidate.hpp"
#include "zshard/plan/fit_capacity.hpp"
#include "zshard/plan/fit_model.hpp"
#include "zshard/plan/fit_problem.hpp"
#include "zshard/plan/fit_time_model.hpp"
#include "zshard/plan/gpu_rates.hpp"

namespace zshard::plan {

enum class fit_outcome : std::uint8_t { fits, family_floor, activation_floor, too_big, refused, not_planned };

constexpr const char* to_string(fit_outcome o) noexcept {
  switch (o) {
    case fit_outcome::fits: return "fits";
    case fit_outcome::family_floor: return "family floor";
    case fit_outcome::activation_floor: return "activation floor";
    case fit_outcome::too_big: return "plan over capacity";
    case fit_outcome::refused: return "refused by the engine";
    case fit_outcome::not_planned: return "not planned (slower at best)";
  }
  return "?";
}

struct fit_entry {
  fit_candidate candidate;
  fit_outcome outcome = fit_outcome::not_planned;
  std::string reason;              // what ruled it out, in words
  step_time_terms lower_bound;     // the time model on the bytes no plan goes below
  std::optional<memory_plan> plan;  // when planned
  step_time_terms time;            // when planned
  std::size_t device_total = 0, host_per_node = 0, nvme_per_node = 0;
};

struct fit_family_verdict {
  fit_family family;
  std::size_t candidates = 0, fit = 0, planned = 0;
  std::string verdict;  // ruled out by ..., or the best fitting candidate's time
};

struct fit_result {
  std::vector<fit_entry> entries;        // every candidate, in enumeration order
  std::vector<std::size_t> ranking;      // indices of fitting entries, fastest first (at least `top` when as many fit)
  std::vector<fit_family_verdict> families;
  std::size_t planned = 0;               // plan walks (candidates planned; family floors not counted)
  std::size_t floor_plans = 0;           // minimal-step plans, one per family
  double seconds = 0;

  const fit_entry* best() const noexcept { return ranking.empty() ? nullptr : &entries[ranking.front()]; }
  std::size_t count(fit_outcome o) const noexcept {
    std::size_t n = 0;
    for (const auto& e : entries) n += e.outcome == o;
    return n;
  }
};

namespace detail {

// Plans e.candidate on `schedule` and predicts its step time: e's plan, time, figures and
// outcome (fits, over capacity, or refused with the engine's words).
inline void evaluate(const fit_problem& pr, fit_entry& e, const engine_config& cfg, const training_schedule& schedule) {
  const fit_machine& mc = pr.machine;
  try {
    memory_plan p = plan_candidate(pr.model, e.candidate, cfg, mc, schedule);
    e.device_total = p.device_total();
    e.host_per_node = host_bytes_per_node(p, mc);
    e.nvme_per_node = nvme_bytes_per_node(p, mc);
    const step_volume v = measure_step_volume(pr.model, e.candidate, cfg, mc, schedule.cycle.front());
    e.time = predict_step_time(v, bytes_of(p), e.candidate, cfg, mc);
    e.reason = over_capacity(p, mc);
    e.outcome = e.reason.empty() ? fit_outcome::fits : fit_outcome::too_big;
    e.plan = std::move(p);
  } catch (const error& err) {
    e.outcome = fit_outcome::refused;
    e.reason = err.message();
  }
}

}  // namespace detail

// One candidate, planned and timed on the problem's model and machine (a configuration to
// compare with the search's choice, such as the one a DeepSpeed config describes).
inline fit_entry evaluate_candidate(const fit_problem& pr, const fit_candidate& c, const engine_config& cfg) {
  fit_entry e;
  e.candidate = c;
  detail::evaluate(pr, e, cfg, pr.model.schedule(c.step));
  return e;
}

inline fit_result fit_search(fit_problem problem) {
  const auto t0 = std::chrono::steady_clock::now();
  const fit_problem pr = prepared(std::move(problem));
  const fit_axes& a = pr.axes;
  const fit_machine& mc = pr.machine;
  const detail::module_sizes ms = detail::sizes_of(pr.model.spec, pr.base);
  fit_result out;

  // Step programs by shape (shared by every family), with their largest activation report.
  struct shaped {
    fit_step_shape shape;
    training_schedule schedule;
    std::size_t largest_activation = 0;
  };
  std::vector<shaped> shapes;
  if (pr.model.step_fixed()) {
    std::size_t act = 0;
    for (const auto& s : pr.model.fixed->cycle) act = std::max(act, detail::largest_activation(s));
    shapes.push_back({{0, micro_batches_of(pr.model.fixed->cycle.front()), -1}, *pr.model.fixed, act});
  } else {
    for (int ck : a.checkpoint_every)
      for (int mb : a.micro_batches) {
        const fit_step_shape s{mb, int(pr.sequences_per_rank() / mb), ck};
        training_schedule sch = pr.model.schedule(s);
        const std::size_t act = detail::largest_activation(sch.cycle.front());
        shapes.push_back({s, std::move(sch), act});
      }
  }

  struct pending {
    std::size_t entry;
    std::size_t shape;
    engine_config cfg;
  };
  std::vector<pending> queue;
  for (int stage : a.stages)
    for (fit_optimizer opt : a.optimizers)
      for (offload_tier params : a.params)
        for (int g : a.shard_groups) {
          const fit_family fam{stage, opt, params, g};
          if (!family_possible(fam, mc)) continue;
          fit_family_verdict verdict{fam, 0, 0, 0, {}};
          // the family floor: a plan of the minimal step
          fit_candidate probe{fam, 0, std::size_t{1} << 60, true, ms.largest, {}};
          const engine_config probe_cfg = config_of(probe, pr.base, mc, pr.nvme_path);
          std::string floor_reason;
          std::optional<memory_plan> floor;
          try {
            floor = detail::floor_of(plan_candidate(pr.model, probe, probe_cfg, mc,
                                                    training_schedule{{detail::minimal_program(pr.model.spec)}}));
            ++out.floor_plans;
            floor_reason = detail::over_capacity(*floor, mc, true);
          } catch (const error& e) {
            floor_reason = "refused: " + e.message();
          }
          for (std::size_t si = 0; si < shapes.size(); ++si)
            for (std::size_t pf : a.prefetch_numel)
              for (std::size_t bucket : a.bucket_numel) {
                fit_candidate c{fam, pf, 0, false, bucket, shapes[si].shape};
                // room for the window, the module and a held recompute, and never below the largest
                // module (no allow_oversized_module: DeepSpeed has no key for it)
                c.max_live_numel = std::max({pr.base.prefetch.max_live_numel, pf + 2 * ms.typical, ms.largest});
                fit_entry e;
                e.candidate = c;
                ++verdict.candidates;
                if (!floor_reason.empty()) {
                  e.outcome = fit_outcome::family_floor;
                  e.reason = floor_reason;
                  out.entries.push_back(std::move(e));
                  continue;
                }
                const engine_config cfg = config_of(c, pr.base, mc, pr.nvme_path);
                // the activation floor: the largest report beside the terms held all run
                memory_plan act = *floor;
                act.device.peak[std::size_t(mem_category::activations)] =
                    act.device.at_total_peak[std::size_t(mem_category::activations)] = shapes[si].largest_activation;
                act.device.total_peak += shapes[si].largest_activation;
                act.device.peak_phase = "the step's largest activation report";
                if (auto why = detail::over_capacity(act, mc); !why.empty()) {
                  e.outcome = fit_outcome::activation_floor;
                  e.device_total = act.device_total();
                  e.reason = why;
                  out.entries.push_back(std::move(e));
                  continue;
                }
                const step_volume v =
                    measure_step_volume(pr.model, c, cfg, mc, shapes[si].schedule.cycle.front());
                step_bytes lb;
                lb.moved.disk_read = floor->moved.disk_read;
                lb.moved.disk_written = floor->moved.disk_written;
                e.lower_bound = predict_step_time(v, lb, c, cfg, mc);
                queue.push_back({out.entries.size(), si, cfg});
                out.entries.push_back(std::move(e));
              }
          out.families.push_back(std::move(verdict));
        }

  // Plan in the order of the lower bound; stop when the next cannot beat the `top` fastest.
  std::stable_sort(queue.begin(), queue.end(), [&](const pending& x, const pending& y) {
    return out.entries[x.entry].lower_bound.total < out.entries[y.entry].lower_bound.total;
  });
  std::vector<double> fitting;  // predicted times of fitting candidates, sorted
  const int threads = pr.threads > 0 ? pr.threads
                                     : std::clamp(int(std::thread::hardware_concurrency()), 1, 8);
  auto plan_one = [&](const pending& q) {
    detail::evaluate(pr, out.entries[q.entry], q.cfg, shapes[q.shape].schedule);
  };
  std::size_t next = 0;
  while (next < queue.size()) {
    if (!pr.exhaustive && fitting.size() >= std::size_t(pr.top) &&
        out.entries[queue[next].entry].lower_bound.total > fitting[std::size_t(pr.top) - 1])
      break;
    const std::size_t n = std::min(queue.size() - next, std::size_t(threads));
    if (n == 1) {
      plan_one(queue[next]);
    } else {
      std::vector<std::thread> pool;
      for (std::size_t k = 1; k < n; ++k) pool.emplace_back([&, k] { plan_one(queue[next + k]); });
      plan_one(queue[next]);
      for (auto& t : pool) t.join();
    }
    for (std::size_t k = 0; k < n; ++k) {
      const fit_entry& e = out.entries[queue[next + k].entry];
      ++out.planned;
      if (e.outcome == fit_outcome::fits)
        fitting.insert(std::upper_bound(fitting.begin(), fitting.end(), e.time.total), e.time.total);
    }
    next += n;
  }

  for (std::size_t i = 0; i < out.entries.size(); ++i)
    if (out.entries[i].outcome == fit_outcome::fits) out.ranking.push_back(i);
  // fastest first; among equally fast ones the smaller device total (smaller budgets)
  std::stable_sort(out.ranking.begin(), out.ranking.end(), [&](std::size_t x, std::size_t y) {
    const fit_entry &a = out.entries[x], &b = out.entries[y];
    return a.time.total != b.time.total ? a.time.total < b.time.total : a.device_total < b.device_total;
  });

  // Family verdicts: the fastest fitting candidate, or what ruled the family out.
  for (auto& f : out.families) {
    const fit_entry *best = nullptr, *tightest = nullptr, *floor_out = nullptr, *act_out = nullptr;
    std::size_t skipped = 0;
    for (const auto& e : out.entries) {
      if (!(e.candidate.family == f.family)) continue;
      if (e.plan) ++f.planned;
      switch (e.outcome) {
        case fit_outcome::fits:
          ++f.fit;
          if (!best || e.time.total < best->time.total) best = &e;
          break;
        case fit_outcome::too_big:
          if (!tightest || e.device_total < tightest->device_total) tightest = &e;
          break;
        case fit_outcome::family_floor:
          floor_out = &e;
          break;
        case fit_outcome::activation_floor:
        case fit_outcome::refused:
          if (!act_out || e.device_total < act_out->device_total) act_out = &e;
          break;
        case fit_outcome::not_planned:
          ++skipped;
          break;
      }
    }
    char buf[200];
    if (best) {
      std::snprintf(buf, sizeof buf, "%zu of %zu planned fit; fastest %.3f s per step", f.fit, f.planned,
                    best->time.total);
      f.verdict = buf;
    } else if (floor_out) {
      f.verdict = "out (family floor): " + floor_out->reason;
    } else if (skipped > 0) {
      f.verdict = "not planned: " + std::to_string(skipped) + " candidate(s) pass the floors, each slower at best than the " +
                  "fastest " + std::to_string(pr.top) + " that fit";
    } else if (tightest) {
      f.verdict = "out: none of " + std::to_string(f.planned) + " planned fits; the smallest: " + tightest->reason;
    } else if (act_out) {
      f.verdict = "out (activation floor): the smallest step shape: " + act_out->reason;
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace zshard::plan

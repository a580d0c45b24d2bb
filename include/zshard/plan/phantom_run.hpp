#pragma once
// Runs a training schedule (plan/schedule.hpp) on the real engine over the phantom backend and a null communicator:
// one engine simulates rank 0 of a virtual world (every rank is the same under the even
// partitioner), every allocation is accounted and none is made, so a 70B-parameter step
// takes milliseconds. The result is what a real run's ledgers would read, step by step: the
// run-side counterpart of plan_memory() for the same inputs.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/schedule.hpp"
#include "zshard/plan/step_schedule.hpp"

namespace zshard::plan {

struct phantom_result {
  memory_ledger after_construction;  // the device ledger once the engine is built
  std::vector<memory_ledger> steps;  // the device ledger after each step; peaks of that step only
  std::vector<step_report> reports;
  // The offloader's state ledger when it is not the device's (host_adam): its whole-run peaks.
  std::optional<memory_ledger> host;
  // The NVMe tier's files (offload_config::optimizer_state = nvme), and the bytes the last step
  // moved between tiers (host_adam's traffic(); memory_plan::moved).
  std::optional<memory_ledger> nvme;
  tier_traffic moved_per_step{};
  std::uint64_t bytes_sent_per_step = 0;  // by rank 0's collectives, ring schedule (null_comm)
  // The same, by communicator under hybrid sharding (engine_config::hybrid): inside rank 0's shard
  // group (the whole world's collectives when flat, the step's checks included), across replica
  // groups, and over the world (the ranks' checks; 0 when flat: they are in the first figure).
  std::uint64_t shard_group_bytes_per_step = 0;
  std::uint64_t across_groups_bytes_per_step = 0;
  std::uint64_t world_bytes_per_step = 0;
  // Forward scopes of the last step that opened with parameters resident beyond those of the
  // open scopes: gathered ahead (or kept) by the Prefetcher.
  std::size_t scopes_with_gathers_ahead = 0;

  // The device ledger's peak over all steps.
  std::size_t peak() const noexcept {
    std::size_t p = after_construction.total_peak();
    for (const auto& s : steps) p = std::max(p, s.total_peak());
    return p;
  }
  // The step whose window holds the run's peak (its per-category figures are the run's).
  const memory_ledger& peak_step() const noexcept {
    const memory_ledger* best = &after_construction;
    for (const auto& s : steps)
      if (s.total_peak() >= best->total_peak()) best = &s;
    return *best;
  }
  // Steps (after the first) whose peak exceeds the previous step's: memory growing over time.
  int steps_with_growth() const noexcept {
    int n = 0;
    for (std::size_t i = 1; i < steps.size(); ++i) n += steps[i].total_peak() > steps[i - 1].total_peak();
    return n;
  }
};

namespace detail {

// Counts forward scopes that open with more elements resident than the open scopes use: the
// Prefetcher gathered ahead (or kept) something. Forward scopes only: during backward the
// HookTracker holds recomputed modules, which is not prefetch.
struct ahead_counter {
  std::size_t* count;
  std::vector<module_id> open{};
  std::vector<std::size_t> stamp{};
  std::size_t tick = 0;

  template <class Engine>
  void operator()(Engine& eng, const schedule_event& e) {
    if (e.kind == event_kind::close) {
      for (std::size_t i = open.size(); i-- > 0;)
        if (open[i] == e.module) {
          open.erase(open.begin() + std::ptrdiff_t(i));
          break;
        }
      return;
    }
    if (e.kind != event_kind::open) return;
    open.push_back(e.module);
    if (e.scope != scope_kind::forward) return;
    stamp.resize(eng.spec().params().size(), 0);
    ++tick;
    std::size_t own = 0;
    for (module_id m : open)
      for (param_id p : eng.spec().modules()[m].params)
        if (stamp[p] != tick && !eng.layout(p).replicated) {
          stamp[p] = tick;
          own += eng.layout(p).padded_numel;
        }
    if (eng.resident_numel() > own) ++*count;
  }
};

}  // namespace detail

// `steps` optimizer steps of `schedule` (its cycle of step programs, in order) on rank 0 of
// `world` virtual ranks. A device budget turns an overshoot into the engine's
// error_kind::budget error, thrown from here.
template <class Policies = default_policies>
phantom_result run_phantom(const model_spec& spec, const engine_config& cfg, int world,
                           const training_schedule& schedule, int steps,
                           std::optional<std::size_t> device_budget = std::nullopt) {
  ZSHARD_REQUIRE(steps >= 1, error_kind::config, "run_phantom needs at least one step");
  schedule.validate(spec);
  phantom_backend backend(device_budget, "phantom rank 0");
  null_comm comm(0, world);
  engine<phantom_backend, null_comm, Policies> eng(backend, comm, spec, cfg);
  phantom_result r;
  r.after_construction = backend.ledger();
  const bool hybrid = eng.replica_comm() != nullptr;
  auto sent_on = [&] {  // shard group, across groups, world
    return std::array<std::uint64_t, 3>{hybrid ? eng.comm().total_bytes_sent() : comm.total_bytes_sent(),
                                        hybrid ? eng.replica_comm()->total_bytes_sent() : 0,
                                        hybrid ? comm.total_bytes_sent() : 0};
  };
  auto moved = [&] {
    if constexpr (requires { eng.offloader().traffic(); })
      return eng.offloader().traffic();
    else
      return tier_traffic{};
  };
  for (int s = 0; s < steps; ++s) {
    backend.ledger().reset_peaks();
    const auto sent = sent_on();
    const tier_traffic moved_before = moved();
    const step_program& prog = schedule.cycle[std::size_t(s) % schedule.cycle.size()];
    r.scopes_with_gathers_ahead = 0;
    r.reports.push_back(run_program(eng, prog, detail::ahead_counter{&r.scopes_with_gathers_ahead}));
    const auto now = sent_on();
    r.shard_group_bytes_per_step = now[0] - sent[0];
    r.across_groups_bytes_per_step = now[1] - sent[1];
    r.world_bytes_per_step = now[2] - sent[2];
    r.bytes_sent_per_step = r.shard_group_bytes_per_step + r.across_groups_bytes_per_step + r.world_bytes_per_step;
    r.steps.push_back(backend.ledger());
    r.moved_per_step = moved() - moved_before;
  }
  if (&eng.offloader().state_ledger() != &backend.ledger()) r.host = eng.offloader().state_ledger();
  if constexpr (requires { eng.offloader().nvme(); })
    if (const auto* n = eng.offloader().nvme()) r.nvme = n->ledger();
  return r;
}

template <class Policies = default_policies>
phantom_result run_phantom(const model_spec& spec, const engine_config& cfg, int world, const step_schedule& schedule,
                           int steps, std::optional<std::size_t> device_budget = std::nullopt) {
  schedule.validate(spec);
  return run_phantom<Policies>(spec, cfg, world, training_schedule{{to_program(schedule)}}, steps, device_budget);
}

}  // namespace zshard::plan

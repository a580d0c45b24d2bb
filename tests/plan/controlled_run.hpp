#pragma once
// The run side of the planner's property test: a random case (random_models.hpp) on the real
// engine over the phantom backend, as plan/phantom_run.hpp runs a schedule, plus what the case
// does beside its schedule: keep-gathered modules (set before the first step), no-sync
// accumulation (sync off for every micro-batch of a step but its last) and unfreezing stages
// (set_trainable between steps), with the case's Prefetcher. Returns the device ledger's peaks
// over construction and every step.
#include <algorithm>
#include <array>
#include <cstddef>

#include "random_models.hpp"
#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/schedule.hpp"

namespace plan_test {

struct run_peaks {
  std::array<std::size_t, mem_category_count> category{};
  std::size_t total = 0;
  std::size_t hold_evictions = 0;
  std::size_t max_resident_after_close = 0;  // resident elements with no scope open (I5)
};

template <class Prefetcher>
struct policies_with : default_policies {
  using prefetcher = Prefetcher;
};

template <class Policies>
run_peaks run_controlled_as(const random_case& c, int steps) {
  phantom_backend backend(std::nullopt, "phantom rank 0");
  null_comm comm(0, c.world);
  engine<phantom_backend, null_comm, Policies> eng(backend, comm, c.spec, c.cfg);
  run_peaks r;
  auto note = [&](const memory_ledger& l) {
    for (std::size_t i = 0; i < mem_category_count; ++i) r.category[i] = std::max(r.category[i], l.peak(mem_category(i)));
    r.total = std::max(r.total, l.total_peak());
  };
  note(backend.ledger());
  for (const auto& name : c.options.keep_gathered_until_backward)
    eng.set_keep_gathered_until_backward(eng.spec().module_by_name(name), true);
  for (int s = 0; s < steps; ++s) {
    for (const auto& [at, names] : c.unfreeze)
      if (at == s)
        for (const auto& name : names) eng.set_trainable(eng.spec().param_by_name(name), true);
    const step_program& prog = c.schedule.cycle[std::size_t(s) % c.schedule.cycle.size()];
    int left = 0;
    for (const auto& e : prog.events) left += e.kind == event_kind::end_backward;
    if (c.options.no_sync) eng.set_gradient_sync(left <= 1);
    run_program(eng, prog, [&](auto& e, const plan::schedule_event& ev) {
      if (e.open_scopes() == 0) r.max_resident_after_close = std::max(r.max_resident_after_close, e.resident_numel());
      if (c.options.no_sync && ev.kind == event_kind::end_backward) e.set_gradient_sync(--left <= 1);
    });
    note(backend.ledger());
    backend.ledger().reset_peaks();
  }
  r.hold_evictions = eng.residency_state().hold_evictions();
  return r;
}

inline run_peaks run_controlled(const random_case& c, int steps) {
  switch (c.prefetcher) {
    case custom_prefetcher::neighbour:
      return run_controlled_as<policies_with<neighbour>>(c, steps);
    case custom_prefetcher::hoarder:
      return run_controlled_as<policies_with<hoarder>>(c, steps);
    case custom_prefetcher::none:
      break;
  }
  return run_controlled_as<default_policies>(c, steps);
}

}  // namespace plan_test

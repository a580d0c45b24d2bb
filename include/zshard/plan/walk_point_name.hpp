#pragma once
// Names a point of the planner's walk (plan/plan_walk.hpp) in words, for the plan's peak report.
#include <string>

#include "zshard/model/model_spec.hpp"
#include "zshard/plan/schedule.hpp"
#include "zshard/plan/walk_ledger.hpp"

namespace zshard::plan::detail {

inline constexpr const char* control_call_check =
    "a control call's argument check (set_gradient_sync, set_trainable, ...)";

// A point of the walk in words, as a plan reports where its peak is: the step (and its step
// program when the cycle has several), the event, and what was charged there.
inline std::string describe_walk_point(const walk_point& w, const training_schedule& schedule, const model_spec& spec) {
  if (w.what == 2) return "initialization";
  const step_program& prog = schedule.cycle[w.program];
  std::string s = "step " + std::to_string(w.step + 1) +
                  (schedule.cycle.size() > 1 ? " ('" + prog.name + "')" : std::string()) + ": ";
  if (w.what == 3) return s + "step()";
  if (w.what == 5 && w.event >= prog.events.size()) return s + "before its first event: " + control_call_check;
  if (w.what == 5) s += "after ";
  if (w.event < prog.events.size()) {
    const auto& e = prog.events[w.event];
    if (e.kind == event_kind::open || e.kind == event_kind::close)
      s += std::string(e.kind == event_kind::open ? "" : "closing ") + to_string(e.scope) + " of " +
           spec.module(e.module).name;
    else if (e.kind == event_kind::end_backward)
      s += "end of backward";
    else if (e.kind == event_kind::activations)
      s += "activations";
    else if (e.kind == event_kind::gather_param)
      s += "gather_param(" + spec.param(e.param).name + ")";
    else if (e.kind == event_kind::export_params)
      s += "export";
  }
  if (w.what == 1) s += ": reduce-scatter of " + spec.param(w.param).name;
  if (w.what == 5) s += ": " + std::string(control_call_check);
  return s;
}

}  // namespace zshard::plan::detail

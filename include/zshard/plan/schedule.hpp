#pragma once
// The schedule language the memory planner reads (plan/memory_plan.hpp): what a training loop
// asks of the engine during each optimizer step, call by call. An event is one engine call:
//
//   open(m, forward | no_grad | recompute | backward)   eng.forward(m) / forward(m, no_grad) /
//                                                       recompute(m) / backward(m): a scope opens
//   close(m, backward?)                                 that scope closes (scopes may nest and
//                                                       close in any order, as RAII scopes do)
//   begin_backward / end_backward                       one micro-batch's backward
//   activations(bytes)                                  eng.report_activations(bytes): absolute
//   gather_param(p) / export_params                     eng.gather_param(p); gather_param of
//                                                       every parameter in turn (a checkpoint export)
//
// A step program is the events between two eng.step() calls; a training schedule is a cycle of
// step programs run in order, again and again (eval every 4 steps: three training steps and one
// with a no-grad pass). Everything users do is a sequence of these calls: no-grad passes, a
// module used several times, shared parameters (the model_spec lists them), nested scopes,
// checkpointed segments recomputed together, gradient accumulation. Build programs with
// plan/schedule_builder.hpp, read them from a file (plan/schedule_file.hpp), or record them
// from your own step function (plan/schedule_recorder.hpp). run_program() drives an engine
// through one, so that a plan and a run are compared on the same program.
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "zshard/core/enum_name.hpp"
#include "zshard/core/error.hpp"
#include "zshard/engine/step_report.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/track/hook_tracker.hpp"

namespace zshard::plan {

enum class event_kind : std::uint8_t {
  open,
  close,
  begin_backward,
  end_backward,
  activations,
  gather_param,
  export_params
};
enum class scope_kind : std::uint8_t { forward, no_grad, recompute, backward };

constexpr const char* to_string(scope_kind k) noexcept {
  return enum_name<const char*>(k, {{scope_kind::forward, "forward"}, {scope_kind::no_grad, "no_grad"},
                                    {scope_kind::recompute, "recompute"}, {scope_kind::backward, "backward"}});
}

// What the trace Prefetcher records for a scope: a backward is recorded as a counted use.
constexpr use_kind use_of(scope_kind k) noexcept {
  return k == scope_kind::no_grad     ? use_kind::no_grad
         : k == scope_kind::recompute ? use_kind::recompute
                                      : use_kind::counted;
}

struct schedule_event {
  event_kind kind = event_kind::open;
  scope_kind scope = scope_kind::forward;  // open, close (close: backward or not)
  module_id module = 0;                    // open, close
  param_id param = 0;                      // gather_param
  std::size_t bytes = 0;                   // activations

  static schedule_event open(module_id m, scope_kind k) { return {event_kind::open, k, m, 0, 0}; }
  static schedule_event close(module_id m, scope_kind k) { return {event_kind::close, k, m, 0, 0}; }
  static schedule_event begin_backward() { return {event_kind::begin_backward}; }
  static schedule_event end_backward() { return {event_kind::end_backward}; }
  static schedule_event activations(std::size_t b) { return {event_kind::activations, scope_kind::forward, 0, 0, b}; }
  static schedule_event gather(param_id p) { return {event_kind::gather_param, scope_kind::forward, 0, p, 0}; }
  static schedule_event export_params() { return {event_kind::export_params}; }
  bool operator==(const schedule_event&) const = default;
};

// The events of one optimizer step (eng.step() follows the last one).
struct step_program {
  std::string name = "step";
  std::vector<schedule_event> events;
  bool operator==(const step_program& o) const { return events == o.events; }

  // Structural checks the engine would make too, with the event's index in the message:
  // scopes that close what is not open, backward phases that do not pair, scopes open at a
  // phase change, no backward at all. (Counts per use are checked while planning, as the
  // engine's HookTracker checks them.)
  void validate(const model_spec& spec) const {
    const std::string who = "step program '" + name + "': ";
    std::vector<int> open_scopes(spec.modules().size() * 2, 0);
    int depth = 0, backwards = 0;
    bool in_backward = false;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const auto& e = events[i];
      const std::string at = who + "event #" + std::to_string(i) + ": ";
      switch (e.kind) {
        case event_kind::open:
        case event_kind::close: {
          spec.check_owner(e.module, "step program");
          ZSHARD_REQUIRE(e.module < spec.modules().size(), error_kind::config,
                         at + "module id " + std::to_string(e.module) + " does not exist");
          int& n = open_scopes[2 * e.module + (e.scope == scope_kind::backward)];
          if (e.kind == event_kind::open) {
            ++n, ++depth;
          } else {
            ZSHARD_REQUIRE(n > 0, error_kind::config,
                           at + "closes a " + std::string(e.scope == scope_kind::backward ? "backward" : "forward") +
                               " scope of '" + spec.module(e.module).name + "' that is not open");
            --n, --depth;
          }
          break;
        }
        case event_kind::begin_backward:
        case event_kind::end_backward: {
          const bool begin = e.kind == event_kind::begin_backward;
          ZSHARD_REQUIRE(depth == 0, error_kind::config,
                         at + (begin ? "begin_backward" : "end_backward") + " with module scopes still open");
          ZSHARD_REQUIRE(
              in_backward != begin, error_kind::config,
              at + (begin ? "begin_backward twice without end_backward" : "end_backward without begin_backward"));
          in_backward = begin;
          backwards += !begin;
          break;
        }
        case event_kind::gather_param:
          spec.check_owner(e.param, "step program");
          ZSHARD_REQUIRE(e.param < spec.params().size(), error_kind::config,
                         at + "gather_param of parameter id " + std::to_string(e.param) + " which does not exist");
          break;
        case event_kind::activations:
        case event_kind::export_params:
          break;
      }
    }
    ZSHARD_REQUIRE(depth == 0 && !in_backward, error_kind::config, who + "ends with scopes open or inside backward",
                   "close every scope and call end_backward()");
    ZSHARD_REQUIRE(backwards > 0, error_kind::config, who + "runs no backward",
                   "a step needs at least one begin_backward()/end_backward() (eng.step() refuses otherwise)");
  }
};

// Step programs run in this order, cyclically, for the whole run.
struct training_schedule {
  std::vector<step_program> cycle;

  void validate(const model_spec& spec) const {
    ZSHARD_REQUIRE(!cycle.empty(), error_kind::config, "the training schedule has no step program");
    for (const auto& s : cycle) s.validate(spec);
  }
};

// Drives an engine through one step program, then eng.step(). `probe(eng, event)` runs after
// each scope opens or closes and after each begin_backward / end_backward (for tests and
// benches, or to change settings between micro-batches; default: nothing).
struct no_probe {
  template <class Engine>
  void operator()(Engine&, const schedule_event&) const noexcept {}
};

template <class Engine, class Probe = no_probe>
step_report run_program(Engine& eng, const step_program& program, Probe&& probe = {}) {
  using scope = typename Engine::scope;
  struct open_scope {
    module_id module;
    bool backward;
    scope s;
  };
  std::list<open_scope> open;  // scopes are move-only and not assignable
  for (const auto& e : program.events) {
    switch (e.kind) {
      case event_kind::open: {
        const bool bwd = e.scope == scope_kind::backward;
        if (bwd)
          open.push_back(open_scope{e.module, true, eng.backward(e.module)});
        else if (e.scope == scope_kind::recompute)
          open.push_back(open_scope{e.module, false, eng.recompute(e.module)});
        else
          open.push_back(open_scope{e.module, false, eng.forward(e.module, use_of(e.scope))});
        probe(eng, e);
        break;
      }
      case event_kind::close: {
        const bool bwd = e.scope == scope_kind::backward;
        for (auto it = open.rbegin(); it != open.rend(); ++it)
          if (it->module == e.module && it->backward == bwd) {
            it->s.close();
            open.erase(std::next(it).base());
            break;
          }
        probe(eng, e);
        break;
      }
      case event_kind::begin_backward:
        eng.begin_backward();
        probe(eng, e);
        break;
      case event_kind::end_backward:
        eng.end_backward();
        probe(eng, e);
        break;
      case event_kind::activations:
        eng.report_activations(e.bytes);
        break;
      case event_kind::gather_param:
        (void)eng.gather_param(e.param);
        break;
      case event_kind::export_params:
        for (param_id p = 0; p < eng.spec().params().size(); ++p) (void)eng.gather_param(p);
        break;
    }
  }
  return eng.step();
}

}  // namespace zshard::plan

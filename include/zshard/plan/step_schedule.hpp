#pragma once
// The schedule of one training step of a sequential model, the simplest case of the schedule
// language (plan/schedule.hpp; to_program() below turns it into a step program): modules
// forwarded in order, backward in reverse, checkpointed modules re-run (engine.recompute)
// right before their backward, and the activation bytes the training stack holds reported to
// the engine at fixed points. run_micro_batch() drives a real engine through exactly the calls
// of to_program(), so that a plan and a run compare the same program. For segments of several
// modules recomputed together, nesting, no-grad passes and the rest, use
// plan/schedule_builder.hpp.
//
// Activation protocol (run_micro_batch; the planner assumes exactly this):
//   forward:   inside m's forward scope, activations += kept_bytes(m)
//   backward:  inside m's recompute scope (checkpointed only), activations += recompute_bytes(m);
//              after m's backward scope has closed (its gradients reduced), activations -=
//              kept_bytes(m) + recompute_bytes(m)
// So a module's activations live from its forward until its backward and the reduction of its
// gradients are done (conservative: a real stack frees some during backward).
#include <cstddef>
#include <string>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/engine/step_report.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/schedule_builder.hpp"

namespace zshard::plan {

struct module_step {
  module_id module = 0;
  std::size_t kept_bytes = 0;       // held from its forward until its backward is done
  std::size_t recompute_bytes = 0;  // re-materialised by its recompute, until its backward is done
  bool recomputed = false;          // checkpointed: engine.recompute(m) right before engine.backward(m)
};

struct step_schedule {
  std::vector<module_step> modules;  // forward order; backward runs in reverse; a module may appear several times
  int micro_batches = 1;             // backward passes accumulated per optimizer step

  void validate(const model_spec& spec) const {
    ZSHARD_REQUIRE(!modules.empty(), error_kind::config, "the step schedule runs no module");
    ZSHARD_REQUIRE(micro_batches >= 1, error_kind::config,
                   "micro_batches must be at least 1, got " + std::to_string(micro_batches));
    for (const auto& s : modules) {
      spec.check_owner(s.module, "step schedule");
      ZSHARD_REQUIRE(s.module < spec.modules().size(), error_kind::config,
                     "the step schedule names module id " + std::to_string(s.module) + " which does not exist");
      ZSHARD_REQUIRE(s.recomputed || s.recompute_bytes == 0, error_kind::config,
                     "module '" + spec.module(s.module).name + "' has recompute_bytes but is not recomputed");
    }
  }

  // Bytes of activations held at the end of forward (the whole step's saved tensors).
  std::size_t kept_total() const noexcept {
    std::size_t n = 0;
    for (const auto& s : modules) n += s.kept_bytes;
    return n;
  }
};

// The same step as a step program: each module a segment of its own.
inline step_program to_program(const step_schedule& schedule) {
  std::vector<segment> segments;
  segments.reserve(schedule.modules.size());
  for (const auto& s : schedule.modules)
    segments.push_back({{s.module}, s.kept_bytes, s.recompute_bytes, s.recomputed, std::nullopt});
  return training_step(segments, schedule.micro_batches);
}

// One micro-batch through the engine's scopes with the activation protocol above. No math:
// the model's compute would sit inside the scopes.
template <class Engine>
void run_micro_batch(Engine& eng, const step_schedule& schedule) {
  std::size_t held = 0;
  for (const auto& s : schedule.modules) {
    auto g = eng.forward(s.module);
    held += s.kept_bytes;
    eng.report_activations(held);
    g.close();
  }
  eng.begin_backward();
  for (auto it = schedule.modules.rbegin(); it != schedule.modules.rend(); ++it) {
    if (it->recomputed) {
      auto r = eng.recompute(it->module);
      held += it->recompute_bytes;
      eng.report_activations(held);
      r.close();
    }
    eng.backward(it->module).close();
    held -= it->kept_bytes + it->recompute_bytes;
    eng.report_activations(held);
  }
  eng.end_backward();
}

// A whole optimizer step: schedule.micro_batches micro-batches, then step().
template <class Engine>
step_report run_step(Engine& eng, const step_schedule& schedule) {
  for (int mb = 0; mb < schedule.micro_batches; ++mb) run_micro_batch(eng, schedule);
  return eng.step();
}

}  // namespace zshard::plan

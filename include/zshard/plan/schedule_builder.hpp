#pragma once
// Building step programs (plan/schedule.hpp) from the structure of a training step instead of
// call by call. A micro-batch is a list of segments run forward in order and backward in
// reverse; a segment is one or more modules, optionally inside a parent scope (nesting), and
// optionally checkpointed: then its modules are recomputed together, in forward order, right
// before their backward (DeepSpeed-style checkpointing of a block of several modules). A
// module may appear in several segments (used several times per micro-batch); a parameter
// shared by several modules is the model_spec's business.
//
// Activation protocol (what the builder reports with eng.report_activations, and so what the
// planner assumes):
//   forward:   inside the segment's last module scope, activations += kept_bytes
//   recompute: inside the segment's last recompute scope, activations += recompute_bytes
//   backward:  once the segment's backward scopes have closed (its gradients handed on),
//              activations -= kept_bytes + recompute_bytes
//   no-grad pass: inside each module scope, activations + transient_bytes; back after it
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "zshard/plan/schedule.hpp"

namespace zshard::plan {

struct segment {
  std::vector<module_id> modules;     // forward order
  std::size_t kept_bytes = 0;         // held from its forward until its backward is done
  std::size_t recompute_bytes = 0;    // re-materialised by its recompute, until its backward is done
  bool checkpointed = false;          // recomputed together right before the segment's backward
  std::optional<module_id> parent{};  // a scope enclosing the segment's scopes (e.g. a block's own norms)
};

class program_builder {
 public:
  explicit program_builder(std::string name = "step") { program_.name = std::move(name); }

  // One micro-batch: forward through the segments, begin_backward, backward in reverse
  // (recomputing checkpointed segments first), end_backward.
  program_builder& micro_batch(const std::vector<segment>& segments) {
    for (const auto& s : segments) {
      ZSHARD_REQUIRE(!s.modules.empty(), error_kind::config, "a segment needs at least one module");
      ZSHARD_REQUIRE(s.checkpointed || s.recompute_bytes == 0, error_kind::config,
                     "a segment has recompute_bytes but is not checkpointed");
      run_segment(s, scope_kind::forward, s.kept_bytes);
    }
    begin_backward();
    for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
      if (it->checkpointed) run_segment(*it, scope_kind::recompute, it->recompute_bytes);
      if (it->parent) open(*it->parent, scope_kind::backward);
      for (auto m = it->modules.rbegin(); m != it->modules.rend(); ++m)
        open(*m, scope_kind::backward).close(*m, scope_kind::backward);
      if (it->parent) close(*it->parent, scope_kind::backward);
      activations(held_ - it->kept_bytes - it->recompute_bytes);
    }
    return end_backward();
  }

  // A pass without backward (evaluation, a reference model) over `modules` in order.
  program_builder& no_grad_pass(const std::vector<module_id>& modules, std::size_t transient_bytes = 0) {
    const std::size_t base = held_;
    for (module_id m : modules) {
      open(m, scope_kind::no_grad);
      if (transient_bytes) activations(base + transient_bytes);
      close(m, scope_kind::no_grad);
      if (transient_bytes) activations(base);
    }
    return *this;
  }

  program_builder& gather_param(param_id p) { return push(schedule_event::gather(p)); }
  program_builder& export_params() { return push(schedule_event::export_params()); }

  // Call by call.
  program_builder& open(module_id m, scope_kind k) { return push(schedule_event::open(m, k)); }
  program_builder& close(module_id m, scope_kind k) { return push(schedule_event::close(m, k)); }
  program_builder& begin_backward() { return push(schedule_event::begin_backward()); }
  program_builder& end_backward() { return push(schedule_event::end_backward()); }
  program_builder& activations(std::size_t bytes) {
    held_ = bytes;
    return push(schedule_event::activations(bytes));
  }

  step_program build() const { return program_; }

 private:
  program_builder& push(const schedule_event& e) {
    program_.events.push_back(e);
    return *this;
  }
  void run_segment(const segment& s, scope_kind k, std::size_t adds) {
    if (s.parent) open(*s.parent, k);
    for (std::size_t i = 0; i < s.modules.size(); ++i) {
      open(s.modules[i], k);
      if (i + 1 == s.modules.size() && adds) activations(held_ + adds);
      close(s.modules[i], k);
    }
    if (s.parent) close(*s.parent, k);
  }

  step_program program_;
  std::size_t held_ = 0;
};

// The common case: `micro_batches` identical micro-batches per step.
inline step_program training_step(const std::vector<segment>& segments, int micro_batches = 1,
                                  std::string name = "step") {
  ZSHARD_REQUIRE(micro_batches >= 1, error_kind::config,
                 "micro_batches must be at least 1, got " + std::to_string(micro_batches));
  program_builder b(std::move(name));
  for (int i = 0; i < micro_batches; ++i) b.micro_batch(segments);
  return b.build();
}

}  // namespace zshard::plan

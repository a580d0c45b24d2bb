#pragma once
// Recording a training schedule (plan/schedule.hpp) from your own step function: run it once
// against a schedule_recorder, which has the engine's API (forward, recompute, backward,
// begin_backward, end_backward, report_activations, gather_param, step) and drives a real
// engine on the phantom backend (nothing allocated, no communication), writing down every call.
// Then plan from the recording:
//
//   template <class Engine> void train_step(Engine& eng, batch& b) { ... eng.step(); }
//   auto schedule = zshard::plan::record_schedule(spec, cfg, world, [&](auto& eng) { train_step(eng, b); });
//   auto plan = zshard::plan::plan_memory(spec, cfg, world, schedule);
//
// Your step function must be generic over the engine type (it is anyway if it runs on more
// than one backend). On the phantom backend the scopes hand out views without storage: skip
// the math when `Engine::records_schedule` is true (or `!Engine::backend_type::holds_storage`).
// Recording runs the real engine, so a loop that misuses it fails here, with the engine's
// error, before any plan is made.
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/schedule.hpp"

namespace zshard::plan {

template <class Policies = default_policies>
class schedule_recorder {
 public:
  using engine_type = engine<phantom_backend, null_comm, Policies>;
  using backend_type = phantom_backend;
  static constexpr bool records_schedule = true;

  // A scope of the recorded engine: forwards to the engine's scope and notes its closing.
  class scope {
   public:
    scope(scope&& o) noexcept : rec_(std::exchange(o.rec_, nullptr)), event_(o.event_), inner_(std::move(o.inner_)) {}
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    scope& operator=(scope&&) = delete;
    ~scope() {
      if (rec_) rec_->note(schedule_event::close(event_.module, event_.scope));
    }
    void close() {
      if (auto* r = std::exchange(rec_, nullptr)) {
        r->note(schedule_event::close(event_.module, event_.scope));
        inner_.close();
      }
    }
    module_id module() const noexcept { return inner_.module(); }
    bool is_backward() const noexcept { return inner_.is_backward(); }
    std::size_t param_count() const { return inner_.param_count(); }
    const_view param(std::size_t k) const { return inner_.param(k); }
    mutable_view grad(std::size_t k) const { return inner_.grad(k); }

   private:
    friend schedule_recorder;
    scope(schedule_recorder* r, schedule_event e, typename engine_type::scope inner)
        : rec_(r), event_(e), inner_(std::move(inner)) {}
    schedule_recorder* rec_;
    schedule_event event_;
    typename engine_type::scope inner_;
  };

  schedule_recorder(const model_spec& spec, engine_config cfg, int world)
      : comm_(0, world), eng_(backend_, comm_, spec, quiet(std::move(cfg))) {
    current_.name = "recorded step 1";
  }

  scope forward(module_id m, use_kind kind = use_kind::counted) {
    auto inner = eng_.forward(m, kind);
    return open(m, kind == use_kind::no_grad ? scope_kind::no_grad : scope_kind::forward, std::move(inner));
  }
  scope recompute(module_id m) { return open(m, scope_kind::recompute, eng_.recompute(m)); }
  scope backward(module_id m) { return open(m, scope_kind::backward, eng_.backward(m)); }
  void begin_backward() {
    eng_.begin_backward();
    note(schedule_event::begin_backward());
  }
  void end_backward() {
    eng_.end_backward();
    note(schedule_event::end_backward());
  }
  void report_activations(std::size_t bytes) {
    eng_.report_activations(bytes);
    note(schedule_event::activations(bytes));
  }
  std::vector<float> gather_param(param_id p) {
    auto v = eng_.gather_param(p);  // checks p first: a rejected id is not recorded
    note(schedule_event::gather(p));
    return v;
  }
  step_report step() {
    step_report r = eng_.step();
    recorded_.cycle.push_back(std::move(current_));
    current_ = {};
    current_.name = "recorded step " + std::to_string(recorded_.cycle.size() + 1);
    return r;
  }

  float loss_scale() const noexcept { return eng_.loss_scale(); }
  float lr() const noexcept { return eng_.lr(); }
  void set_lr(float lr) { eng_.set_lr(lr); }
  const model_spec& spec() const noexcept { return eng_.spec(); }
  const engine_config& config() const noexcept { return eng_.config(); }
  const shard_layout& layout(param_id p) const { return eng_.layout(p); }  // checked: may throw
  engine_type& recorded_engine() noexcept { return eng_; }
  // Events since the last step() (a step function that has not called it yet).
  bool step_open() const noexcept { return !current_.events.empty(); }
  const training_schedule& recorded() const noexcept { return recorded_; }

 private:
  static engine_config quiet(engine_config c) {
    c.log = [](const std::string&) {};  // a trace divergence while recording is not news
    return c;
  }
  scope open(module_id m, scope_kind k, typename engine_type::scope inner) {
    const auto e = schedule_event::open(m, k);
    note(e);
    return scope(this, e, std::move(inner));
  }
  void note(const schedule_event& e) { current_.events.push_back(e); }

  phantom_backend backend_{std::nullopt, "recording"};
  null_comm comm_;
  engine_type eng_;
  step_program current_;
  training_schedule recorded_;
};

// Runs `step_fn(recorder)` (or `step_fn(recorder, step_index)`) `steps` times on a recorder and
// returns what it recorded: one step program per step() call, in order, as the cycle the
// planner repeats. A step function that does not call step() itself gets it called after it.
// Identical consecutive programs at the end of the recording are kept: they are what makes
// the Prefetcher record once and replay.
template <class Policies = default_policies, class StepFn>
training_schedule record_schedule(const model_spec& spec, const engine_config& cfg, int world, StepFn&& step_fn,
                                  int steps = 1) {
  ZSHARD_REQUIRE(steps >= 1, error_kind::config, "record_schedule needs at least one step");
  schedule_recorder<Policies> rec(spec, cfg, world);
  for (int s = 0; s < steps; ++s) {
    if constexpr (std::is_invocable_v<StepFn&, schedule_recorder<Policies>&, int>)
      step_fn(rec, s);
    else
      step_fn(rec);
    if (rec.step_open()) rec.step();
  }
  return rec.recorded();
}

}  // namespace zshard::plan

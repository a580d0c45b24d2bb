// 04_plan_your_model: plan a model's memory from your own training step, before training.
//
// The step function below is an ordinary zshard training step, written once and generic over
// the engine: a tied embedding, a shared block used twice, a checkpointed segment of two
// modules recomputed together, two micro-batches, and an evaluation pass (no-grad) every third
// step. It runs three times against a schedule_recorder (the real engine on the phantom
// backend: nothing allocated, nothing sent), which writes down every call; the recording is
// planned, saved as a schedule file that tools/zshard_plan reads, and then the same function
// trains for real on thread ranks, whose measured peaks are checked against the plan.
//
// Usage: 04_plan_your_model [schedule-file]     (default: recorded.zsched)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/schedule_file.hpp"
#include "zshard/plan/schedule_recorder.hpp"
#include "zshard/testing/plan_check.hpp"

using namespace zshard;

namespace {

struct model {
  model_spec spec;
  module_id embed, shared, attn, mlp, head;
  model() {
    const param_id e = spec.add_param("embed.weight", {512, 64});
    embed = spec.add_module("embed", {e});
    shared = spec.add_module("shared", {spec.add_param("shared.w", {64, 64})});
    attn = spec.add_module("attn", {spec.add_param("attn.qkv", {64, 192}), spec.add_param("attn.o", {64, 64})});
    mlp = spec.add_module("mlp", {spec.add_param("mlp.up", {64, 256}), spec.add_param("mlp.down", {256, 64})});
    head = spec.add_module("head", {spec.add_param("head.norm", {64}, {.decay = false}), e});  // tied
  }
};

constexpr std::size_t tokens = 256, act = tokens * 64 * 4;  // bytes of one hidden state (f32)

// Your training step: the engine type is a template parameter, so the same code records and trains.
template <class Engine>
void train_step(Engine& eng, const model& m, int step) {
  constexpr bool real = Engine::backend_type::holds_storage;  // false while recording: no math
  for (int micro = 0; micro < 2; ++micro) {
    std::size_t held = 0;
    auto forward = [&](module_id id, std::size_t keep) {
      auto s = eng.forward(id);
      if constexpr (real) (void)s.param(0);  // your kernels would read the gathered weights here
      eng.report_activations(held += keep);
    };
    forward(m.embed, act);
    forward(m.shared, act);
    forward(m.attn, act);  // attn + mlp: a checkpointed segment, only its input kept
    forward(m.mlp, 0);
    forward(m.shared, act);  // the shared block again
    forward(m.head, 4 * act);
    eng.begin_backward();
    eng.backward(m.head).close();
    eng.report_activations(held -= 4 * act);
    eng.backward(m.shared).close();
    eng.report_activations(held -= act);
    {
      auto a = eng.recompute(m.attn);
      auto b = eng.recompute(m.mlp);
      eng.report_activations(held + 6 * act);  // the segment's activations, re-materialised
    }
    eng.backward(m.mlp).close();
    eng.backward(m.attn).close();
    eng.report_activations(held -= act);
    eng.backward(m.shared).close();
    eng.report_activations(held -= act);
    eng.backward(m.embed).close();
    eng.report_activations(held -= act);
    eng.end_backward();
  }
  if (step % 3 == 2)  // evaluation every third step
    for (module_id id : {m.embed, m.shared, m.attn, m.mlp, m.shared, m.head}) {
      auto s = eng.forward(id, use_kind::no_grad);
      eng.report_activations(2 * act);
    }
  eng.report_activations(0);
  eng.step();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "recorded.zsched";
  const model m;
  const int world = 4;
  engine_config cfg;
  cfg.prefetch.prefetch_numel = 40'000;
  cfg.prefetch.max_live_numel = 60'000;
  cfg.reduce.reduce_bucket_numel = 20'000;

  // 1. Record: three steps (the third with the evaluation pass), on the phantom backend.
  const plan::training_schedule recorded = plan::record_schedule(
      m.spec, cfg, world, [&](auto& eng, int step) { train_step(eng, m, step); }, 3);
  // 2. Plan from the recording, and save it for `zshard_plan --schedule`.
  const plan::memory_plan plan = plan::plan_memory(m.spec, cfg, world, recorded);
  std::ofstream(path) << [&] {
    std::ostringstream os;
    plan::write_schedule_file(os, m.spec, cfg, world, plan::optimizer_location::device, recorded);
    return os.str();
  }();
  std::printf("recorded %zu step programs (%zu calls), saved to %s\n", recorded.cycle.size(),
              recorded.cycle[0].events.size() + recorded.cycle[1].events.size() + recorded.cycle[2].events.size(),
              path.c_str());

  // 3. Train for real on thread ranks with the same function; every rank's peak within the plan.
  std::mutex mu;
  bool within = true;
  memory_ledger rank0;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, m.spec, cfg);
    for (int step = 0; step < 6; ++step) train_step(eng, m, step);
    std::lock_guard lock(mu);
    within = within && testing::peak_over_plan(backend.ledger(), plan.device).empty();
    if (comm.rank() == 0) rank0 = backend.ledger();
  });
  plan::print_plan(std::cout, plan, &rank0);
  std::printf("every rank within the plan: %s\n", within ? "yes" : "NO");
  return within ? 0 : 1;
}

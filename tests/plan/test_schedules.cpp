// The schedule language against real runs: the host backend on thread ranks (every allocation
// real) through programs with what users do (tied weights, a block used twice, nested scopes,
// checkpointed segments, no-grad evaluation every few steps, gradient accumulation,
// gather_param and exports); recording a schedule from a step function; the schedule file;
// the GPU terms in `fits`.
#include <doctest/doctest.h>

#include <mutex>
#include <sstream>
#include <vector>

#include "small_model.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/schedule_file.hpp"
#include "zshard/plan/schedule_recorder.hpp"
#include "zshard/testing/plan_check.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

using plan_test::small_config;
using plan_test::small_model;

// Every rank's device ledger after `steps` steps of the schedule's cycle, with the modules in
// `keep` kept gathered until their backward and, with no_sync, gradient sync off for every
// micro-batch but a step's last.
std::vector<memory_ledger> ledgers_after(const model_spec& spec, const engine_config& cfg, int world,
                                         const training_schedule& schedule, int steps,
                                         const std::vector<std::string>& keep = {}, bool no_sync = false) {
  std::mutex mu;
  std::vector<memory_ledger> out;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, spec, cfg);
    for (const auto& m : keep) eng.set_keep_gathered_until_backward(eng.spec().module_by_name(m), true);
    for (int s = 0; s < steps; ++s) {
      const step_program& prog = schedule.cycle[std::size_t(s) % schedule.cycle.size()];
      int left = 0;
      for (const auto& e : prog.events) left += e.kind == event_kind::end_backward;
      if (no_sync) eng.set_gradient_sync(left <= 1);
      run_program(eng, prog, [&](auto& e, const plan::schedule_event& ev) {
        if (no_sync && ev.kind == event_kind::end_backward) e.set_gradient_sync(--left <= 1);
      });
    }
    std::lock_guard lock(mu);
    out.push_back(backend.ledger());
  });
  return out;
}

}  // namespace

TEST_CASE("schedules: tied weights, reuse, nesting, segments, no-grad every 3 steps, accumulation, exports") {
  const small_model model;
  for (std::size_t max_live : {std::size_t{100'000}, std::size_t{4'500}}) {  // loose, then binding
    for (int world : {1, 3}) {
      const engine_config cfg = small_config(max_live);
      const training_schedule schedule = model.with_eval(2);
      const memory_plan plan = plan_memory(model.spec, cfg, world, schedule);
      for (const memory_ledger& l : ledgers_after(model.spec, cfg, world, schedule, 7)) {
        std::ostringstream table;
        print_plan(table, plan, &l);
        INFO("max_live " << max_live << ", world " << world << "\n" << table.str());
        ZSHARD_CHECK_PEAK_WITHIN_PLAN(l, plan.device);  // gather_param and export scratch included
        if (max_live == 100'000) CHECK(double(plan.device.total_peak) <= 1.05 * double(l.total_peak()));
      }
      CHECK(plan.steps_simulated >= 3);
    }
  }
}

TEST_CASE("schedules: the tied weight's gradient waits for its last use") {
  const small_model model;
  engine_config cfg = small_config(100'000);
  cfg.reduce.reduce_bucket_numel = 1;  // every gradient is reduced as soon as it is complete
  // (head.norm, frozen at registration, stays frozen: the grad_buckets figure is then exact)
  const memory_plan plan =
      plan_memory(model.spec, cfg, 2, training_step(model.segments()), {.frozen_params_stay_frozen = true});
  // From head's backward to embed's, embed.w's full f32 gradient (1200 elements) is held.
  const std::size_t largest_module = 4 * (24 * 64 + 64 * 24);
  CHECK(plan.device.peak_of(mem_category::grad_buckets) >= 4 * 1200 + largest_module);
  const auto ledgers = ledgers_after(model.spec, cfg, 2, training_schedule{{training_step(model.segments())}}, 2);
  for (const auto& l : ledgers)
    CHECK(l.peak(mem_category::grad_buckets) == plan.device.peak_of(mem_category::grad_buckets));
}

namespace {

// A user's step function: generic over the engine, math skipped when recording.
template <class Engine>
void user_step(Engine& eng, const small_model& m, bool eval) {
  std::size_t held = 0;
  auto fwd = [&](module_id id, std::size_t bytes) {
    auto s = eng.forward(id);
    eng.report_activations(held += bytes);
    if constexpr (Engine::backend_type::holds_storage) (void)s.param(0);
  };
  fwd(m.embed, 800);
  for (int b : {0, 1, 1}) {
    auto parent = eng.forward(m.blocks[b]);
    eng.forward(m.attn[b]).close();
    auto inner = eng.forward(m.mlp[b]);
    eng.report_activations(held += 400);
  }
  fwd(m.head, 2000);
  eng.begin_backward();
  eng.backward(m.head).close();
  eng.report_activations(held -= 2000);
  for (int b : {1, 1, 0}) {
    {
      auto parent = eng.recompute(m.blocks[b]);
      eng.recompute(m.attn[b]).close();
      auto inner = eng.recompute(m.mlp[b]);
      eng.report_activations(held += 3000);
    }
    {
      auto parent = eng.backward(m.blocks[b]);
      eng.backward(m.mlp[b]).close();
      eng.backward(m.attn[b]).close();
    }
    eng.report_activations(held -= 3400);
  }
  eng.backward(m.embed).close();
  eng.report_activations(held -= 800);
  eng.end_backward();
  if (eval)
    for (module_id id : {m.embed, m.attn[0], m.head}) {
      auto s = eng.forward(id, use_kind::no_grad);
      eng.report_activations(held + 5000);
      s.close();
      eng.report_activations(held);
    }
  eng.step();
}

}  // namespace

TEST_CASE("schedules: recorded from the user's step function, planned, and the plan bounds the run") {
  const small_model model;
  const engine_config cfg = small_config(4'500);
  const training_schedule recorded = record_schedule(
      model.spec, cfg, 3, [&](auto& eng, int s) { user_step(eng, model, s % 2 == 1); }, 2);
  REQUIRE(recorded.cycle.size() == 2);
  CHECK(recorded.cycle[0].events.size() < recorded.cycle[1].events.size());  // the second has the eval pass
  const memory_plan plan = plan_memory(model.spec, cfg, 3, recorded);
  std::mutex mu;
  run_ranks(3, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, model.spec, cfg);
    for (int s = 0; s < 6; ++s) user_step(eng, model, s % 2 == 1);
    std::lock_guard lock(mu);
    ZSHARD_CHECK_PEAK_WITHIN_PLAN(backend.ledger(), plan.device);
  });
  // The recording replays through the engine as the same calls.
  const auto ledgers = ledgers_after(model.spec, cfg, 3, recorded, 4);
  for (const auto& l : ledgers) ZSHARD_CHECK_PEAK_WITHIN_PLAN(l, plan.device);
  // A step function that misuses the engine fails while recording, with the engine's error.
  CHECK_THROWS_WITH_AS(record_schedule(model.spec, cfg, 2, [&](auto& eng) { eng.backward(model.head).close(); }),
                       doctest::Contains("outside backward"), error);
}

TEST_CASE("schedule file: written, read back equal, planned the same; errors name the line") {
  const small_model model;
  engine_config cfg = small_config(4'500);
  const training_schedule schedule = model.with_eval(2);
  std::stringstream file;
  write_schedule_file(file, model.spec, cfg, 3, optimizer_location::host, schedule);
  const schedule_file f = read_schedule_file(file, "written");
  CHECK(f.world == 3);
  CHECK(f.optimizer == optimizer_location::host);
  CHECK(f.spec.fingerprint() == model.spec.fingerprint());
  REQUIRE(f.schedule.cycle.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(f.schedule.cycle[i] == schedule.cycle[i]);
  const memory_plan a = plan_memory(model.spec, cfg, 3, schedule, {.optimizer = optimizer_location::host});
  const memory_plan b = plan_memory(f.spec, f.cfg, f.world, f.schedule, {.optimizer = f.optimizer});
  CHECK(a.device.total_peak == b.device.total_peak);
  CHECK(a.host.total_peak == b.host.total_peak);

  const char* hand = R"(zshard-schedule 1
world 2
param w 8x8
param b 8 no_decay
module lin w b
step train x2
  forward lin
  activations 100
  begin_backward
  backward lin
  end_backward
end
)";
  std::istringstream in(hand);
  const schedule_file h = read_schedule_file(in);
  CHECK(h.schedule.cycle.size() == 2);
  CHECK(plan_memory(h.spec, h.cfg, h.world, h.schedule).device.peak_of(mem_category::activations) == 100);

  auto refuses = [](const std::string& text, const std::string& words) {
    std::istringstream bad(text);
    CHECK_THROWS_WITH_AS(read_schedule_file(bad, "bad"), doctest::Contains(words.c_str()), error);
  };
  refuses("world 2\n", "bad:1: the first statement must be `zshard-schedule 1`");
  refuses("zshard-schedule 1\nparam w 0x3\n", "bad:2:");
  refuses("zshard-schedule 1\nparam w 3\nmodule m w\nstep s\n  forward nope\nend\n", "bad:5: no module named 'nope'");
  refuses("zshard-schedule 1\nparam w 3\nmodule m w\nstep s\n  forward m\n", "has no `end`");
  refuses("zshard-schedule 1\nparam w 3\nmodule m w\nstep s\n  forward m\nend\n", "runs no backward");
  refuses("zshard-schedule 1\nmax_live_numel lots\n", "bad:2: 'lots' is not a whole non-negative count");
}

TEST_CASE("plan: GPU terms are beside the ledger and count in fits") {
  const small_model model;
  const engine_config cfg = small_config(100'000);
  const step_program step = training_step(model.segments());
  const memory_plan bare = plan_memory(model.spec, cfg, 2, step);
  const memory_plan gpu = plan_memory(model.spec, cfg, 2, step, {.overheads = device_overheads::cuda_defaults()});
  CHECK(gpu.device.total_peak == bare.device.total_peak);  // the ledger's figure does not change
  const device_overheads d = device_overheads::cuda_defaults();
  CHECK(gpu.device_total() == gpu.device.total_peak + d.cuda_context_bytes + d.nccl_bytes_per_communicator +
                                  d.workspace_bytes + d.pool_bytes(gpu.device.total_peak));
  CHECK(d.pool_bytes(std::size_t{1} << 30) >= (std::size_t{1} << 30) / 20);
  CHECK(d.pool_bytes(std::size_t{1} << 30) % (2u << 20) == 0);
  CHECK(bare.fits(bare.device.total_peak));
  CHECK_FALSE(gpu.fits(gpu.device.total_peak));
  CHECK(gpu.fits(gpu.device_total()));
  CHECK_FALSE(gpu.fits(gpu.device_total() - 1));
}


TEST_CASE("plan: kept-gathered modules and no-sync accumulation are planned, and the plan bounds the run") {
  const small_model model;
  const std::vector<std::string> keep = {"block0.attn", "head"};
  for (std::size_t max_live : {std::size_t{100'000}, std::size_t{4'500}}) {  // loose, then binding
    for (int world : {1, 3}) {
      const engine_config cfg = small_config(max_live);
      const training_schedule schedule = model.with_eval(3);
      const memory_plan plain = plan_memory(model.spec, cfg, world, schedule, {.frozen_params_stay_frozen = true});
      const memory_plan plan = plan_memory(model.spec, cfg, world, schedule,
                                           {.keep_gathered_until_backward = keep, .no_sync = true,
                                            .frozen_params_stay_frozen = true});
      for (const memory_ledger& l : ledgers_after(model.spec, cfg, world, schedule, 6, keep, true)) {
        std::ostringstream table;
        print_plan(table, plan, &l);
        INFO("max_live " << max_live << ", world " << world << "\n" << table.str());
        ZSHARD_CHECK_PEAK_WITHIN_PLAN(l, plan.device);
        if (max_live == 100'000) {
          // exact where max_live_numel does not bind: both terms are replayed, not bounded
          CHECK(l.peak(mem_category::grad_buckets) == plan.device.peak_of(mem_category::grad_buckets));
          CHECK(l.peak(mem_category::gathered_params) == plan.device.peak_of(mem_category::gathered_params));
        }
      }
      // The options change the plan: no-sync holds every trainable gradient in full between
      // micro-batches, which the plan without it would not cover.
      CHECK(plan.device.peak_of(mem_category::grad_buckets) > plain.device.peak_of(mem_category::grad_buckets));
      if (max_live == 100'000)
        CHECK(plan.device.peak_of(mem_category::gathered_params) >=
              plain.device.peak_of(mem_category::gathered_params));
    }
  }
}

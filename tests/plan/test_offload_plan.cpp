// The planner with the tiers beyond the device (issue 29, plan/offload_terms.hpp): parameters in
// host memory, optimizer state in host memory or on NVMe. Against the phantom run of the same
// schedule (the real engine and host_adam, accounting only) the plan is exact when max_live_numel
// does not bind: every device, host and NVMe category to the byte, and the bytes a step moves
// between the tiers; it stays an upper bound when it binds. Against a host-backend run on thread
// ranks with real NVMe files, the host and NVMe ledgers and the moved bytes are exact as well.
#include <doctest/doctest.h>

#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "../checkpoint/test_dir.hpp"
#include "small_model.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/schedule_builder.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

struct host_policies : default_policies {
  using offloader = offload::host_adam;
};

// plan_test::small_model: its frozen norm is never unfrozen (the plans say so,
// frozen_params_stay_frozen, and are exact). Every step the same program (two micro-batches,
// then a no-grad evaluation pass, a gather_param and an export), so that the bytes moved by the
// run's last step are the plan's (the steady state).
struct offload_model : plan_test::small_model {
  training_schedule schedule() const { return training_schedule{{train_and_eval(2)}}; }
};

struct tiers {
  offload_tier params, state;
  std::string name() const {
    return "parameters on " + std::string(to_string(params)) + ", optimizer state on " + std::string(to_string(state));
  }
};

engine_config config(std::size_t max_live, tiers t, const std::string& nvme_dir) {
  engine_config cfg = plan_test::small_config(max_live);
  cfg.offload.host_threads = 1;
  cfg.offload.params = t.params;
  cfg.offload.optimizer_state = t.state;
  cfg.offload.nvme_path = nvme_dir;
  cfg.offload.nvme_chunk_numel = 1024;
  cfg.offload.nvme_buffer_count = 3;
  return cfg;
}

void check_ledger_equal(const memory_ledger& run, const ledger_plan& plan, const char* which) {
  INFO(which);
  for (std::size_t c = 0; c < mem_category_count; ++c) {
    INFO(to_string(mem_category(c)));
    CHECK(run.peak(mem_category(c)) == plan.peak[c]);
  }
  CHECK(run.total_peak() == plan.total_peak);
}

// The host-optimizer plan of offload_model's schedule under cfg and its phantom run of six
// steps; every step's device peaks are checked within the plan's, category by category.
struct planned_run {
  memory_plan plan;
  phantom_result run;
};
planned_run plan_and_run(const offload_model& model, const engine_config& cfg, int world) {
  const training_schedule schedule = model.schedule();
  planned_run r{
      plan_memory(model.spec, cfg, world, schedule,
                  {.optimizer = optimizer_location::host, .initialization = false, .frozen_params_stay_frozen = true}),
      run_phantom<host_policies>(model.spec, cfg, world, schedule, 6)};
  for (const auto& s : r.run.steps)
    for (std::size_t c = 0; c < mem_category_count; ++c) CHECK(s.peak(mem_category(c)) <= r.plan.device.peak[c]);
  return r;
}

const tiers all_tiers[] = {{offload_tier::host, offload_tier::host},
                           {offload_tier::device, offload_tier::nvme},
                           {offload_tier::host, offload_tier::nvme}};

}  // namespace

TEST_CASE("offload plan equals the phantom run to the byte: device, host and NVMe ledgers, bytes moved") {
  const offload_model model;
  for (const tiers t : all_tiers) {
    for (int world : {1, 3, 8}) {
      INFO(t.name() << ", world " << world);
      const auto [plan, run] =
          plan_and_run(model, config(100'000, t, "/nonexistent (phantom runs create no file)"), world);
      std::ostringstream table;
      print_plan(table, plan, &run.peak_step(), run.host ? &*run.host : nullptr, run.nvme ? &*run.nvme : nullptr);
      INFO(table.str());
      std::size_t peak = run.peak(), scratch = 0, gathered = 0, sharded = 0;
      for (const auto& s : run.steps) {
        scratch = std::max(scratch, s.peak(mem_category::scratch));
        gathered = std::max(gathered, s.peak(mem_category::gathered_params));
        sharded = std::max(sharded, s.peak(mem_category::sharded_params));
      }
      CHECK(peak == plan.device.total_peak);
      CHECK(scratch == plan.device.peak_of(mem_category::scratch));
      CHECK(gathered == plan.device.peak_of(mem_category::gathered_params));
      CHECK(sharded == plan.device.peak_of(mem_category::sharded_params));
      REQUIRE(run.host);
      check_ledger_equal(*run.host, plan.host, "host");
      if (t.state == offload_tier::nvme) {
        REQUIRE(run.nvme);
        check_ledger_equal(*run.nvme, plan.nvme, "nvme");
        CHECK(plan.nvme.total_peak > 0);
      } else {
        CHECK(!run.nvme);
        CHECK(plan.nvme.total_peak == 0);
      }
      CHECK(run.moved_per_step == plan.moved);  // the steady state
      CHECK(plan.moved.to_host > 0);
      CHECK((plan.moved.to_device > 0));
      CHECK((plan.moved.disk_read > 0) == (t.state == offload_tier::nvme));
      if (t.params == offload_tier::host) {
        CHECK(plan.host.peak_of(mem_category::sharded_params) > 0);
        CHECK(plan.device.peak_of(mem_category::sharded_params) < plan.host.peak_of(mem_category::sharded_params));
      }
    }
  }
}

TEST_CASE("offload plan bounds the phantom run when max_live_numel binds") {
  const offload_model model;
  for (const tiers t : all_tiers) {
    for (int world : {1, 3}) {
      INFO(t.name() << ", world " << world);
      const auto [plan, run] = plan_and_run(model, config(4'500, t, "/phantom"), world);
      CHECK(run.peak() <= plan.device.total_peak);
      check_ledger_equal(*run.host, plan.host, "host");
    }
  }
}

TEST_CASE("offload plan against a host-backend run with real NVMe files: host and NVMe ledgers and bytes moved exact") {
  ckpt_test::temp_dir dir;
  const offload_model model;
  const training_schedule schedule = model.schedule();
  for (const tiers t : all_tiers) {
    for (int world : {1, 3}) {
      INFO(t.name() << ", world " << world);
      const engine_config cfg = config(100'000, t, dir.path());
      const memory_plan plan = plan_memory(model.spec, cfg, world, schedule,
                                           {.optimizer = optimizer_location::host,
                                            .backend_memory_is_host = true,
                                            .frozen_params_stay_frozen = true});
      std::mutex mu;
      run_ranks(world, [&](thread_comm& comm) {
        host_backend backend;
        engine<host_backend, thread_comm, host_policies> eng(backend, comm, model.spec, cfg);
        tier_traffic before{};
        for (int s = 0; s < 6; ++s) {
          before = eng.offloader().traffic();
          run_program(eng, schedule.cycle[std::size_t(s) % schedule.cycle.size()]);
        }
        const tier_traffic last = eng.offloader().traffic() - before;
        std::lock_guard lock(mu);
        CHECK(backend.ledger().total_peak() <= plan.device.total_peak);
        for (std::size_t c = 0; c < mem_category_count; ++c)
          CHECK(backend.ledger().peak(mem_category(c)) <= plan.device.peak[c]);
        check_ledger_equal(eng.offloader().state_ledger(), plan.host, "host");
        if (const auto* n = eng.offloader().nvme()) check_ledger_equal(n->ledger(), plan.nvme, "nvme");
        CHECK(last == plan.moved);
        CHECK(last.to_host == 0);  // host memory: gradients stay where they are
      });
    }
  }
}

TEST_CASE("offload plan refuses what the engine refuses, with the same words") {
  const offload_model model;
  for (const tiers t :
       {tiers{offload_tier::host, offload_tier::host}, tiers{offload_tier::device, offload_tier::nvme}}) {
    engine_config cfg = config(100'000, t, "/x");
    bool thrown = false;
    try {
      (void)plan_memory(model.spec, cfg, 2, model.schedule(), {.optimizer = optimizer_location::device});
    } catch (const error& e) {
      thrown = std::string(e.what()).find("with offload::on_device") != std::string::npos;
    }
    CHECK(thrown);
  }
}

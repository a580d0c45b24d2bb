// Every setting a checkpoint records is agreed across ranks before it is written: a learning
// rate set on one rank only (of the default group, which the manifest records, or of another),
// a step or a loss scaler's state restored on one rank only, optimizer state created for a
// frozen parameter on one rank only — each fails the save on every rank with the same error,
// naming the setting and every rank's value, and writes nothing (the previous checkpoint and
// `latest` stay). A save once recorded rank 0's rate (0.01 where rank 1 had 0.5) without a word.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
namespace fs = std::filesystem;

namespace recorded_settings_test {

zshard::engine_config with_head_group() {
  zshard::engine_config cfg = ckpt_test::engine_options();
  cfg.param_groups = {{.name = "head", .params = {"E", "c"}, .lr = 0.002f}};
  cfg.loss_scale.enabled = true;  // its scale is recorded, and restored, only when on
  return cfg;
}

// On 3 ranks: saves once (a checkpoint to keep), applies `diverge` (on some ranks), saves again;
// returns the error every rank saw ("" when the save succeeded) and checks that a failed save
// left the first checkpoint and `latest` as they were.
std::string save_after(const std::string& dir,
                       const std::function<void(zshard::engine<zshard::host_backend, zshard::thread_comm>&,
                                                const toy::ids&, int rank)>& diverge) {
  ckpt_test::rank_errors errors;
  std::string first;
  ckpt_test::on_ranks(3, with_head_group(), [&](auto& eng, const toy::ids& id) {
    const auto saved = ck::save(eng, dir);
    if (eng.comm().rank() == 0) first = saved.path;
    diverge(eng, id, eng.comm().rank());
    try {
      ck::save(eng, dir);
      errors.add("");
    } catch (const zshard::error& e) {
      errors.add(e.what());
    }
    return 0;
  });
  const std::string e = errors.agreed(3);
  if (!e.empty()) {
    std::size_t entries = 0;
    for (const auto& entry : fs::directory_iterator(dir)) entries += entry.path().filename().string()[0] != '.';
    CHECK(entries == 2);  // the first checkpoint and latest: nothing else written
    CHECK(ck::resolve_checkpoint(dir) == first);
  }
  return e;
}

}  // namespace recorded_settings_test

TEST_CASE("a learning rate set on one rank only fails the save, naming the group and every rank's rate") {
  {  // the default group, whose rate the manifest records (rank 0's was once written silently)
    ckpt_test::temp_dir dir;
    const std::string e = recorded_settings_test::save_after(dir.path(), [](auto& eng, const toy::ids&, int rank) {
      if (rank == 1) eng.set_lr("default", 0.5f);
    });
    CHECK(e.find("ranks disagree on what the checkpoint records (nothing was written)") != std::string::npos);
    CHECK(e.find("the learning rate of parameter group 'default': rank 0 has 0.01, rank 1 has 0.5 ") !=
          std::string::npos);
    CHECK(e.find("'head'") == std::string::npos);  // only what differs
  }
  {  // another group, on two ranks
    ckpt_test::temp_dir dir;
    const std::string e = recorded_settings_test::save_after(dir.path(), [](auto& eng, const toy::ids&, int rank) {
      if (rank != 0) eng.set_lr("head", rank * 0.25f);
    });
    CHECK(e.find("the learning rate of parameter group 'head': rank 0 has 0.002, rank 1 has 0.25, rank 2 has 0.5") !=
          std::string::npos);
  }
  {  // set alike on every rank: saved, and the manifest records it
    ckpt_test::temp_dir dir;
    const std::string e = recorded_settings_test::save_after(
        dir.path(), [](auto& eng, const toy::ids&, int) { eng.set_lr("default", 0.5f); });
    CHECK(e == "");
    const auto m = ck::manifest::parse(ck::read_small_file(ck::resolve_checkpoint(dir.path()) + "/manifest.json"), "m");
    CHECK(m.run.lr == 0.5f);
  }
}

TEST_CASE("a step, a loss scaler state or optimizer state on one rank only fails the save, naming it") {
  ckpt_test::temp_dir dir;
  const std::string e = recorded_settings_test::save_after(dir.path(), [](auto& eng, const toy::ids& id, int rank) {
    if (rank == 2) {
      zshard::run_state r = eng.run_counters();
      r.step = 5;
      r.scaler.scale = 1024.0f;
      r.scaler.good_steps_in_row = 3;
      eng.restore_run_counters(r);
    }
    if (rank == 1) {
      REQUIRE(eng.can_add_optimizer_state(id.s[0]));
      eng.add_optimizer_state(id.s[0]);  // per rank: frozen 's0' gains state here only
    }
  });
  CHECK(e.find("\n  the step: rank 0 has 0, rank 2 has 5") != std::string::npos);
  CHECK(e.find("\n  the loss scale: rank 0 has 65536, rank 2 has 1024") != std::string::npos);
  CHECK(e.find("\n  the loss scaler's good steps in a row: rank 0 has 0, rank 2 has 3") != std::string::npos);
  CHECK(e.find("\n  whether 's0' has optimizer state: rank 0 has false, rank 1 has true") != std::string::npos);
  CHECK(e.find("skipped steps") == std::string::npos);  // only what differs
}

// Per-parameter AdamW update counts in checkpoints (format 2 and later): a parameter without a
// gradient in a step is not updated, its count (bias correction) lags the step, and a resumed run
// continues each from its own. Model: `a` has a gradient every step, `b` none in steps 1-2 (2
// elements: at world 3 rank 2 holds none), `c` none before step 4 (its module also holds a frozen
// parameter). Saved after 3 steps, continued to 7 on 1-3 thread ranks, resharded 2 <-> 3, both
// Offloaders: bit for bit the 7 uninterrupted steps (each rank adds the same gradient, a multiple
// of 1/16, so every world size trains the same bits). A format 1 manifest loads, with a note, and
// is inexact here (the test can fail); damaged counts are refused. Frozen parameters' kept state
// (format 4): saved, restored or created, bit for bit; lost in formats 1-3: refused unless allowed.
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;
using zshard::dtype;

namespace {

struct skip_model {
  zshard::model_spec spec;
  zshard::param_id a, b, c, frozen;
  zshard::module_id ma, mb, mc;
  skip_model() {
    a = spec.add_param("a", {7});
    b = spec.add_param("b", {2});
    c = spec.add_param("c", {6}, {.decay = false});
    frozen = spec.add_param("frozen", {3}, {.trainable = false});
    ma = spec.add_module("A", {a});
    mb = spec.add_module("B", {b});
    mc = spec.add_module("C", {c, frozen});
  }
};

bool uses(zshard::module_id m, const skip_model& sm, int step) {
  if (m == sm.mb) return step != 1 && step != 2;
  if (m == sm.mc) return step >= 4;
  return true;
}

// The same on every rank: k / 16 for k in [-24, 24], from the step, parameter and element.
float grad_value(int step, zshard::param_id p, std::size_t i) {
  std::uint64_t h = (std::uint64_t(step) * 1000003u + p * 7919u + i) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return float(int(h % 49) - 24) / 16.0f;
}

template <class Engine>
void train(Engine& eng, const skip_model& sm, int first, int count) {
  for (int step = first; step < first + count; ++step) {
    for (auto m : {sm.ma, sm.mb, sm.mc})
      if (uses(m, sm, step)) {
        auto g = eng.forward(m);
      }
    eng.begin_backward();
    for (auto m : {sm.mc, sm.mb, sm.ma}) {
      if (!uses(m, sm, step)) continue;
      auto g = eng.backward(m);
      const auto& ps = sm.spec.modules()[m].params;
      for (std::size_t k = 0; k < ps.size(); ++k) {
        if (!eng.spec().params()[ps[k]].trainable) continue;  // the engine's flag: set_trainable changes it
        float* gd = g.grad_data(k);
        for (std::size_t i = 0; i < std::size_t(sm.spec.params()[ps[k]].shape.numel()); ++i)
          gd[i] += grad_value(step, ps[k], i);
      }
    }
    eng.end_backward();
    eng.step();
  }
}

struct result {
  full_state state;
  std::vector<std::int64_t> counts;  // rank 0's
  bool restored = false;
};

zshard::engine_config options(zshard::log_sink log = [](const std::string&) {}) {
  auto c = engine_options(dtype::f32, 1, 0);  // every parameter sharded
  c.log = std::move(log);
  return c;
}

// prepare: changes the model before the engine is built (which parameters are frozen from the start).
template <class Policies, class Fn>
result on_skip_ranks(int world, const zshard::engine_config& cfg, Fn&& fn, void (*prepare)(skip_model&) = nullptr) {
  result out;
  std::mutex mu;
  zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
    skip_model sm;
    if (prepare) prepare(sm);
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm, Policies> eng(backend, comm, sm.spec, cfg);
    const bool restored = fn(eng, sm);
    result r{gather_all(eng), eng.update_counts(), restored};
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      out = std::move(r);
    }
  });
  return out;
}

template <class Policies>
result straight(int world) {
  return on_skip_ranks<Policies>(world, options(), [](auto& eng, const skip_model& sm) {
    train(eng, sm, 0, 7);
    return false;
  });
}

// Steps 0-2 on `world` ranks, then a checkpoint in `dir`.
template <class Policies = zshard::default_policies>
void save_after_3_steps(int world, const std::string& dir) {
  on_skip_ranks<Policies>(world, options(), [&](auto& eng, const skip_model& sm) {
    train(eng, sm, 0, 3);
    ck::save(eng, dir);
    return false;
  });
}

template <class Policies>
result resumed(int save_world, int load_world, const std::string& dir) {
  save_after_3_steps<Policies>(save_world, dir);
  return on_skip_ranks<Policies>(load_world, options(), [&](auto& eng, const skip_model& sm) {
    const auto info = ck::load(eng, dir, {.chunk_bytes = 4096});
    train(eng, sm, 3, 4);
    return info.update_counts_restored;
  });
}

nlohmann::json read_manifest(const std::string& dir) {
  return nlohmann::json::parse(ck::read_small_file(ck::resolve_checkpoint(dir) + "/manifest.json"));
}
// Writes `j` as the manifest, sealed with its checksum as a save does (seal = false: as zshard
// wrote it before format 3, without one).
void write_manifest(const std::string& dir, nlohmann::json j, bool seal = true) {
  j.erase(ck::manifest_checksum_key);
  ck::write_small_file(ck::resolve_checkpoint(dir) + "/manifest.json", seal ? ck::seal_manifest(j.dump(1)) : j.dump(1));
}

template <class Policies>
void exact_with_skipped_steps() {
  const result want = straight<Policies>(1);
  CHECK(want.counts == std::vector<std::int64_t>{7, 5, 3, 0});  // a every step, b skipped 2, c from step 4
  for (int world : {2, 3}) {
    INFO("uninterrupted at world " << world);
    const result r = straight<Policies>(world);
    CHECK(same_bits(r.state, want.state));  // the exact average makes every world size train alike
    CHECK(r.counts == want.counts);
  }
  for (auto [a, b] : {std::pair{1, 1}, {2, 2}, {3, 3}, {2, 3}, {3, 2}}) {
    INFO("saved at world " << a << ", resumed at world " << b);
    temp_dir dir;
    const result r = resumed<Policies>(a, b, dir.path());
    CHECK(r.restored);
    CHECK(r.counts == want.counts);
    CHECK(same_bits(r.state, want.state));
  }
}

// A failed load into a trained engine: every rank's error (they must agree); the engine is untouched.
std::string failed_counts_load(const std::string& dir, int world = 2) {
  rank_errors errors;
  on_skip_ranks<zshard::default_policies>(world, options(), [&](auto& eng, const skip_model& sm) {
    train(eng, sm, 0, 2);
    errors.add(load_error_untouched(eng, dir));
    return false;
  });
  const std::string e = errors.agreed(world);
  CHECK(e.find("manifest.json") != std::string::npos);
  return e;
}

}  // namespace

TEST_CASE("update counts: resume after skipped steps is bit for bit, on_device Offloader (worlds 1-3, 2->3, 3->2)") {
  exact_with_skipped_steps<zshard::default_policies>();
}

TEST_CASE("update counts: resume after skipped steps is bit for bit, host_adam Offloader") {
  exact_with_skipped_steps<host_adam_policies>();
}

TEST_CASE("update counts: the manifest holds them (format 2); a format 1 checkpoint loads at the step, with a note") {
  temp_dir dir;
  save_after_3_steps(2, dir.path());
  nlohmann::json j = read_manifest(dir.path());
  CHECK(j["version"] == 4);
  CHECK(j["update_counts"] == nlohmann::json::array({3, 1, 0, 0}));
  // what zshard wrote before format 2
  j["version"] = 1;
  j.erase("update_counts");
  write_manifest(dir.path(), j, false);
  std::mutex mu;
  std::vector<std::string> notes;
  const auto log = [&](const std::string& line) {
    std::lock_guard lock(mu);
    if (line.find("checkpoint") != std::string::npos) notes.push_back(line);  // not the engine's other notes
  };
  const result old = on_skip_ranks<zshard::default_policies>(3, options(log), [&](auto& eng, const skip_model& sm) {
    const auto info = ck::load(eng, dir.path());
    // every parameter at the step, but `frozen`: no state saved, it starts over (count 0)
    CHECK(eng.update_counts() == std::vector<std::int64_t>{3, 3, 3, 0});
    train(eng, sm, 3, 4);
    return info.update_counts_restored;
  });
  CHECK(!old.restored);
  REQUIRE(notes.size() == 1);  // rank 0 says it once
  CHECK(notes[0].find("format version 1") != std::string::npos);
  CHECK(notes[0].find("no checksum of its manifest") != std::string::npos);
  CHECK(notes[0].find("no per-parameter update counts") != std::string::npos);
  CHECK(notes[0].find("step 3") != std::string::npos);
  // b and c skipped steps before the save: the fallback is not exact on this model
  CHECK(!same_bits(old.state, straight<zshard::default_policies>(3).state));
}

TEST_CASE("update counts: damaged or mismatched counts are refused, naming the manifest; the engine is untouched") {
  temp_dir dir;
  save_after_3_steps(3, dir.path());
  const nlohmann::json good = read_manifest(dir.path());
  auto damaged = [&](auto&& change) {
    nlohmann::json j = good;
    change(j);
    write_manifest(dir.path(), j);
    return failed_counts_load(dir.path());
  };
  std::string e = damaged([](nlohmann::json& j) { j["update_counts"].erase(3); });
  CHECK(e.find("\"update_counts\" has 3 entries for 4 parameters") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["update_counts"].push_back(0); });
  CHECK(e.find("has 5 entries for 4 parameters") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["update_counts"][1] = 4; });
  CHECK(e.find("update count of parameter 'b' is 4, outside [0, 3]") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["update_counts"][0] = -1; });
  CHECK(e.find("update count of parameter 'a' is -1, outside [0, 3]") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["update_counts"][2] = 1.5; });
  CHECK(e.find("update count of parameter 'c' is not an integer: 1.5") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["update_counts"][2] = "2"; });
  CHECK(e.find("not an integer") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["update_counts"][0] = 18446744073709551615ull; });
  CHECK(e.find("outside [0, 3]") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["update_counts"] = 3; });
  CHECK(e.find("\"update_counts\" is not an array") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j.erase("update_counts"); });
  CHECK(e.find("format version 4 without \"update_counts\"") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["version"] = 5; });
  CHECK(e.find("format version 5, this zshard reads 1 to 4") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["params"][3].erase("optimizer_state"); });
  CHECK(e.find("format version 4 without \"optimizer_state\" for parameter 'frozen'") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["params"][0]["optimizer_state"] = false; });
  CHECK(e.find("trainable parameter 'a' without optimizer state") != std::string::npos);
  // the good manifest still loads, exactly; a chunk too small for one element is refused first
  write_manifest(dir.path(), good);
  on_skip_ranks<zshard::default_policies>(2, options(), [&](auto& eng, const skip_model&) {
    CHECK_THROWS_WITH_AS(ck::load(eng, dir.path(), {.chunk_bytes = 16}),
                         doctest::Contains("chunk_bytes of 16 is too small"), zshard::error);
    CHECK(eng.steps_taken() == 0);
    CHECK(ck::load(eng, dir.path()).update_counts_restored);
    CHECK(eng.update_counts() == std::vector<std::int64_t>{3, 1, 0, 0});
    return false;
  });
}

TEST_CASE("update counts: restore_update_counts validates before it changes anything") {
  on_skip_ranks<zshard::default_policies>(2, options(), [&](auto& eng, const skip_model& sm) {
    train(eng, sm, 0, 3);
    const auto counts = eng.update_counts();
    CHECK_THROWS_WITH_AS(eng.restore_update_counts({1, 1, 1}), doctest::Contains("3 update counts for a model of 4"),
                         zshard::error);
    CHECK_THROWS_WITH_AS(eng.restore_update_counts({1, 4, 0, 0}), doctest::Contains("update count 4 of 'b'"),
                         zshard::error);
    CHECK(eng.update_counts() == counts);
    eng.restore_update_counts({2, 2, 1, 0});
    CHECK(eng.update_counts() == std::vector<std::int64_t>{2, 2, 1, 0});
    return false;
  });
}

// ---- Frozen parameters keep their optimizer state (set_trainable); checkpoints save it ----------
// `a` trains in steps 0-2 and is frozen for step 3: it keeps its master, m, v and update count 3.
// The checkpoint is taken after step 3; then `a` is unfrozen (and, with `wake`, `frozen`, which
// never trained: its state is created now) and steps 4-6 run. A resumed run must equal the
// uninterrupted one bit for bit: zero moments under the saved count would not.
namespace {

template <class Engine>
void freeze_phase(Engine& eng, const skip_model& sm) {
  train(eng, sm, 0, 3);
  eng.set_trainable(sm.a, false);
  train(eng, sm, 3, 1);
}
template <class Engine>
void unfreeze_phase(Engine& eng, const skip_model& sm, bool wake) {
  eng.set_trainable(sm.a, true);
  if (wake) eng.set_trainable(sm.frozen, true);
  train(eng, sm, 4, 3);
}

template <class Policies>
result frozen_straight(int world, const zshard::engine_config& cfg, bool wake = false) {
  return on_skip_ranks<Policies>(world, cfg, [&](auto& eng, const skip_model& sm) {
    freeze_phase(eng, sm);
    unfreeze_phase(eng, sm, wake);
    return false;
  });
}

template <class Policies>
void save_frozen(int world, const zshard::engine_config& cfg, const std::string& dir) {
  on_skip_ranks<Policies>(world, cfg, [&](auto& eng, const skip_model& sm) {
    freeze_phase(eng, sm);
    ck::save(eng, dir);
    return false;
  });
}

// A fresh engine (built after `prepare`) runs before_load(eng, sm), freezes `a` as it was saved,
// loads, unfreezes and trains steps 4-6.
template <class Policies, class Before>
result frozen_resumed(int world, const zshard::engine_config& cfg, const std::string& dir, Before&& before_load,
                      void (*prepare)(skip_model&) = nullptr, bool wake = false, bool restart_lost = false) {
  return on_skip_ranks<Policies>(
      world, cfg,
      [&](auto& eng, const skip_model& sm) {
        before_load(eng, sm);
        if (eng.spec().params()[sm.a].trainable) eng.set_trainable(sm.a, false);
        const auto info = ck::load(eng, dir, {.chunk_bytes = 4096, .restart_lost_frozen_state = restart_lost});
        unfreeze_phase(eng, sm, wake);
        return info.update_counts_restored;
      },
      prepare);
}
template <class Policies>
result frozen_resumed(int world, const zshard::engine_config& cfg, const std::string& dir,
                      void (*prepare)(skip_model&) = nullptr) {
  return frozen_resumed<Policies>(world, cfg, dir, [](auto&, const skip_model&) {}, prepare);
}

zshard::engine_config on_nvme(const std::string& nvme_dir) {
  auto c = options();
  c.offload.params = zshard::offload_tier::host;
  c.offload.optimizer_state = zshard::offload_tier::nvme;
  c.offload.nvme_path = nvme_dir;
  c.offload.nvme_chunk_numel = 1024;
  c.offload.nvme_buffer_count = 3;
  return c;
}

template <class Policies>
void frozen_state_resumes_exactly(const zshard::engine_config& cfg, std::initializer_list<std::pair<int, int>> worlds) {
  const result want = frozen_straight<Policies>(1, cfg);
  CHECK(want.counts == std::vector<std::int64_t>{6, 5, 3, 0});  // a: 3 before the freeze, 3 after
  for (auto [a, b] : worlds) {
    INFO("saved at world " << a << ", resumed at world " << b);
    temp_dir dir;
    save_frozen<Policies>(a, cfg, dir.path());
    const result r = frozen_resumed<Policies>(b, cfg, dir.path());
    CHECK(r.restored);
    CHECK(r.counts == want.counts);
    CHECK(same_bits(r.state, want.state));
  }
}

void frozen_from_start(skip_model& sm) { sm.spec.set_trainable(sm.a, false); }
void frozen_trainable(skip_model& sm) { sm.spec.set_trainable(sm.frozen, true); }

}  // namespace

TEST_CASE("frozen parameters: a checkpoint keeps a frozen parameter's optimizer state; unfrozen, the resumed run "
          "is bit for bit (both Offloaders, NVMe; worlds 1-3, 2->3, 3->2)") {
  SUBCASE("on_device") {
    frozen_state_resumes_exactly<zshard::default_policies>(options(), {{1, 1}, {2, 2}, {3, 3}, {2, 3}, {3, 2}});
  }
  SUBCASE("host_adam") {
    frozen_state_resumes_exactly<host_adam_policies>(options(), {{1, 1}, {2, 2}, {3, 3}, {2, 3}, {3, 2}});
  }
  SUBCASE("host_adam, parameters in host memory, optimizer state on NVMe") {
    temp_dir scratch;
    frozen_state_resumes_exactly<host_adam_policies>(on_nvme(scratch.path()), {{1, 1}, {2, 3}});
  }
}

TEST_CASE("frozen parameters: loaded into an engine that has no state for one (frozen from the start), the load "
          "creates it; on NVMe, where it cannot, the load is refused naming the parameter, the engine untouched") {
  const auto check = [](auto policies) {
    using P = decltype(policies);
    const result want = frozen_straight<P>(1, options());
    for (auto [a, b] : {std::pair{2, 2}, {3, 2}}) {
      INFO("saved at world " << a << ", resumed at world " << b);
      temp_dir dir;
      save_frozen<P>(a, options(), dir.path());
      const result r = frozen_resumed<P>(b, options(), dir.path(), frozen_from_start);
      CHECK(r.counts == want.counts);
      CHECK(same_bits(r.state, want.state));
    }
  };
  check(zshard::default_policies{});
  check(host_adam_policies{});
  temp_dir scratch, dir;
  const auto cfg = on_nvme(scratch.path());
  save_frozen<host_adam_policies>(2, cfg, dir.path());
  std::mutex mu;
  std::vector<std::string> errors;
  on_skip_ranks<host_adam_policies>(
      2, cfg,
      [&](auto& eng, const skip_model&) {
        std::string what;
        try {
          ck::load(eng, dir.path());
        } catch (const zshard::error& e) {
          what = e.what();
        }
        CHECK(eng.steps_taken() == 0);
        CHECK(eng.update_counts() == std::vector<std::int64_t>(4, 0));
        std::lock_guard lock(mu);
        errors.push_back(what);
        return false;
      },
      frozen_from_start);
  REQUIRE(errors.size() == 2);
  CHECK(errors[0] == errors[1]);
  CHECK(errors[0].find("'a'") != std::string::npos);
  CHECK(errors[0].find("NVMe") != std::string::npos);
}

TEST_CASE("frozen parameters: a checkpoint without a parameter's state (it never trained) resets the state an "
          "engine kept for it, as a first unfreeze creates it") {
  temp_dir dir;
  save_frozen<zshard::default_policies>(2, options(), dir.path());  // `frozen` never trained: no state saved
  for (int world : {2, 3}) {
    INFO("world " << world);
    const result want = frozen_straight<zshard::default_policies>(world, options(), /*wake=*/true);
    CHECK(want.counts == std::vector<std::int64_t>{6, 5, 3, 3});
    // An engine in which `frozen` trained (moments, count 7), then frozen: its state is stale.
    const result r = frozen_resumed<zshard::default_policies>(
        world, options(), dir.path(),
        [](auto& eng, const skip_model& sm) {
          train(eng, sm, 0, 7);
          eng.set_trainable(sm.frozen, false);
        },
        frozen_trainable, /*wake=*/true);
    CHECK(r.counts == want.counts);
    CHECK(same_bits(r.state, want.state));
  }
}

TEST_CASE("frozen parameters: a format 3 checkpoint (no state of frozen parameters) is refused where a frozen "
          "parameter had updates; allowed, its state starts over, named in the log") {
  temp_dir dir;
  save_frozen<zshard::default_policies>(2, options(), dir.path());
  nlohmann::json j = read_manifest(dir.path());
  CHECK(j["params"][0]["optimizer_state"] == true);  // `a`, frozen, kept its state: saved
  CHECK(j["params"][3]["optimizer_state"] == false);  // `frozen` never trained
  j["version"] = 3;  // what zshard wrote before format 4: state of trainable parameters only
  for (auto& p : j["params"]) p.erase("optimizer_state");
  write_manifest(dir.path(), j);
  std::mutex mu;
  std::vector<std::string> notes;
  const auto log = [&](const std::string& line) {
    std::lock_guard lock(mu);
    if (line.find("checkpoint") != std::string::npos) notes.push_back(line);
  };
  // By default the load refuses, on every rank, naming `a` only; the engine is untouched.
  on_skip_ranks<zshard::default_policies>(2, options(), [&](auto& eng, const skip_model& sm) {
    eng.set_trainable(sm.a, false);
    const auto before = eng.update_counts();
    CHECK_THROWS_WITH_AS(ck::load(eng, dir.path()),
                         doctest::Contains("lacks the optimizer state (m, v) of frozen parameter(s) 'a', which had "
                                           "updates before they were frozen"),
                         zshard::error);
    CHECK(eng.update_counts() == before);
    return false;
  });
  // `a` kept state in the loading engine (built trainable, then frozen): reset to a fresh start
  const result reset = frozen_resumed<zshard::default_policies>(
      3, options(log), dir.path(), [](auto& eng, const skip_model&) { CHECK(eng.has_optimizer_state(0)); }, nullptr,
      false, /*restart_lost=*/true);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("(format version 3) lacks the optimizer state of frozen parameter(s) 'a',") != std::string::npos);
  CHECK(notes[0].find("'frozen'") == std::string::npos);  // never trained: nothing lost
  // the same as an engine that never had state for `a` and creates it at the unfreeze
  const result created = frozen_resumed<zshard::default_policies>(
      3, options(), dir.path(), [](auto&, const skip_model&) {}, frozen_from_start, false, /*restart_lost=*/true);
  CHECK(reset.counts == std::vector<std::int64_t>{3, 5, 3, 0});  // a: 3 updates after the restart
  CHECK(created.counts == reset.counts);
  CHECK(same_bits(reset.state, created.state));
  CHECK(!same_bits(reset.state, frozen_straight<zshard::default_policies>(3, options()).state));  // not exact
  on_skip_ranks<zshard::default_policies>(2, options(), [&](auto& eng, const skip_model& sm) {
    eng.set_trainable(sm.a, false);
    const auto info = ck::load(eng, dir.path(), {.restart_lost_frozen_state = true});
    CHECK(!info.frozen_state_restored);
    CHECK(eng.update_counts() == std::vector<std::int64_t>{0, 2, 0, 0});  // `a` starts over
    return false;
  });
}

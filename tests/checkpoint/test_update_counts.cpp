// Per-parameter AdamW update counts in checkpoints (format version 2 and later). A parameter without a
// gradient in a step is not updated and its count (its bias correction) lags the engine's
// step; a resumed run must continue each parameter from its own count. The model: `a` has a
// gradient every step, `b` none in steps 1 and 2 (2 elements: at world 3 rank 2 holds none of
// it), `c` none before step 4 (its module also holds a frozen parameter). Saved after 3 steps
// and continued to 7, on 1, 2 and 3 thread ranks, resharded 2 -> 3 and 3 -> 2, with both
// Offloaders, the result equals 7 uninterrupted steps bit for bit. Each rank adds the same
// gradient, a small multiple of 1/16, so the average over ranks is exact and every world size
// trains the same bits: resharded runs compare bitwise too. A format 1 manifest (no counts)
// still loads, says so in the log, and is then inexact on this model (which shows the test
// can fail); damaged counts are refused, naming the manifest, the engine untouched.
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
        if (!sm.spec.params()[ps[k]].trainable) continue;
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

template <class Policies, class Fn>
result on_skip_ranks(int world, const zshard::engine_config& cfg, Fn&& fn) {
  result out;
  std::mutex mu;
  zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
    skip_model sm;
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
  CHECK(j["version"] == 3);
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
    CHECK(eng.update_counts() == std::vector<std::int64_t>(4, 3));  // every parameter at the step
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
  CHECK(e.find("format version 3 without \"update_counts\"") != std::string::npos);
  e = damaged([](nlohmann::json& j) { j["version"] = 4; });
  CHECK(e.find("format version 4, this zshard reads 1 to 3") != std::string::npos);
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

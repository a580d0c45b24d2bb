// Errors that cross ranks (checkpoint/agreement.hpp): of any length, with any bytes in them,
// they reach every rank whole, with their kind and hint; a real load error longer than the
// 1 KB block the exchange once used arrives intact. And the manifest's checks name the right
// culprit: an edited `decay` flag is a difference of the model, an edited layout blames the
// manifest, not the rank file.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;

namespace {

// What agree() needs of an engine: a backend and the job's communicator.
struct bare_engine {
  zshard::host_backend& b;
  zshard::thread_comm& c;
  zshard::host_backend& backend() { return b; }
  zshard::thread_comm& comm() { return c; }
};

// Rank `failing` throws `e` inside agree(); returns what every rank caught (rank order).
std::vector<zshard::error> agreed_errors(int world, int failing, const zshard::error& e) {
  std::vector<std::optional<zshard::error>> got(static_cast<std::size_t>(world));
  zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    bare_engine eng{backend, comm};
    try {
      ck::agree(eng, "the test", [&] {
        if (comm.rank() == failing) throw e;
      });
    } catch (const zshard::error& caught) {
      got[static_cast<std::size_t>(comm.rank())] = caught;
    }
  });
  std::vector<zshard::error> out;
  for (auto& g : got) {
    REQUIRE(g.has_value());
    out.push_back(*g);
  }
  return out;
}

}  // namespace

TEST_CASE("an error of any length and content reaches every rank whole, with its kind and hint") {
  for (const std::size_t length : {std::size_t{1}, std::size_t{1023}, std::size_t{1024}, std::size_t{1025},
                                   std::size_t{5000}, std::size_t{100'000}}) {
    // every byte value shows up, the separator and NUL included, and lines like a real report's
    std::string message;
    for (std::size_t i = 0; i < length; ++i) message += i % 61 == 60 ? '\n' : char(i % 256);
    const std::string hint = "the hint\x1f with a separator in it";
    for (const int failing : {0, 2}) {
      CAPTURE(length);
      CAPTURE(failing);
      const auto errors = agreed_errors(3, failing, zshard::error(zshard::error_kind::config, message, hint));
      for (const auto& e : errors) {
        CHECK(e.kind() == zshard::error_kind::config);
        CHECK(e.message() == "the test (rank " + std::to_string(failing) + "): " + message);
        CHECK(e.hint() == hint);
      }
    }
  }
}

TEST_CASE("a load error over 1 KB arrives whole on every rank: its kind, its last line, its hint") {
  temp_dir dir;
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    ck::save(eng, dir.path());
    return 0;
  });
  // a model of 60 parameters with long names: 60 "missing" lines, several KB of message
  zshard::model_spec other;
  std::vector<zshard::param_id> ids;
  for (int i = 0; i < 60; ++i)
    ids.push_back(other.add_param("a.rather.long.parameter.name.that.fills.the.line." + std::to_string(i), {3}));
  other.add_module("all", ids);
  rank_errors whats;
  zshard::run_ranks(3, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, other, engine_options());
    try {
      ck::load(eng, dir.path());
    } catch (const zshard::error& e) {
      CHECK(e.kind() == zshard::error_kind::config);
      CHECK(e.hint() == "load a checkpoint of this model, or build the model the checkpoint holds");
      whats.add(e.what());
    }
  });
  const std::string w = whats.agreed(3);
  CHECK(w.size() > 4096);
  CHECK(w.starts_with("zshard: configuration error: checkpoint load from"));
  CHECK(w.find("missing from the checkpoint: 'a.rather.long.parameter.name.that.fills.the.line.59' [3]") !=
        std::string::npos);
  CHECK(w.find('\x1f') == std::string::npos);
  CHECK(w.ends_with("(how to fix: load a checkpoint of this model, or build the model the checkpoint holds)"));
}

TEST_CASE("an edited decay flag in a manifest is a difference of the model") {
  temp_dir dir;
  const std::string path = on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    return ck::save(eng, dir.path()).path;
  });
  const std::string mpath = path + "/manifest.json";
  std::ifstream in(mpath);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ck::manifest m = ck::manifest::parse(text, mpath);
  toy::ids id;
  const zshard::model_spec spec = toy::make_spec(toy::config{}, id);
  CHECK(ck::compare_models(m, spec, zshard::dtype::f32).empty());
  const auto& first = spec.params()[zshard::param_id{0}];
  m.params[0].decay = !m.params[0].decay;
  const auto diff = ck::compare_models(m, spec, zshard::dtype::f32);
  REQUIRE(diff.size() == 1);
  CHECK(diff[0] == "'" + first.name + "' has weight decay " + (first.decay ? "on" : "off") + " in the model, " +
                       (first.decay ? "off" : "on") + " in the checkpoint (manifest \"decay\")");
}

TEST_CASE("an edited shard_numel blames the manifest, not the rank file") {
  temp_dir dir;
  const std::string path = on_ranks(3, engine_options(), [&](auto& eng, const toy::ids&) {
    return ck::save(eng, dir.path()).path;
  });
  const std::string mpath = path + "/manifest.json";
  nlohmann::ordered_json j;
  {
    std::ifstream in(mpath);
    in >> j;
  }
  // the largest sharded parameter: one more element per rank still covers it (the manifest parses)
  nlohmann::ordered_json* target = nullptr;
  for (auto& p : j["params"])
    if (!p["replicated"].get<bool>() && (!target || p["numel"].get<int>() > (*target)["numel"].get<int>())) target = &p;
  REQUIRE(target);
  const std::string name = (*target)["name"].get<std::string>();
  (*target)["shard_numel"] = (*target)["shard_numel"].get<int>() + 1;
  {
    std::ofstream out(mpath);
    out << j.dump(1);
  }
  rank_errors errors;
  on_ranks(3, engine_options(), [&](auto& eng, const toy::ids&) {
    errors.add(load_error_untouched(eng, dir.path()));
    return 0;
  });
  const std::string what = errors.agreed(3);
  CAPTURE(what);
  CHECK(what.find("manifest.json") != std::string::npos);
  CHECK(what.find("does not belong to this manifest") == std::string::npos);
}

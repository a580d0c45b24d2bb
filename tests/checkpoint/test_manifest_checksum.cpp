// The manifest's own checksum (format version 3): every single-byte change of manifest.json is
// refused — by the parser alone, at every byte and in several ways, and by a load on every rank
// (a digit of the learning rate, the step, an update count, a loss-scaler counter) with the
// engine untouched. A version 2 manifest, written before the checksum, still loads and says in
// the log what it lacks; a version 3 one without its checksum is refused.
#include <doctest/doctest.h>

#include <mutex>
#include <nlohmann/json.hpp>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;
using zshard::dtype;

namespace {

zshard::engine_config scaled_options(zshard::log_sink log = [](const std::string&) {}) {
  auto c = engine_options(dtype::f16);
  c.loss_scale = {.enabled = true, .initial_scale = 1024.f, .growth_factor = 2.f, .backoff_factor = 0.5f,
                  .growth_interval = 2, .min_scale = 1.f};
  c.log = std::move(log);
  return c;
}

// 3 steps (the loss scale grows once) at world 2, saved; the state at the save.
full_state checksummed_checkpoint(const std::string& dir) {
  return on_ranks(2, scaled_options(), [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, toy::config{}, 0, 3);
    eng.set_lr(3e-3f);
    ck::save(eng, dir);
    return gather_all(eng);
  });
}

std::string manifest_path(const std::string& dir) { return ck::resolve_checkpoint(dir) + "/manifest.json"; }

// Loads `dir` at world 2 into a trained engine; every rank's error (they must agree), the engine
// untouched.
std::string checksum_failed_load(const std::string& dir) {
  rank_errors errors;
  on_ranks(2, scaled_options(), [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, toy::config{}, 0, 1);
    errors.add(load_error_untouched(eng, dir));
    return 0;
  });
  return errors.agreed(2);
}

}  // namespace

TEST_CASE("manifest checksum: every single-byte change anywhere in manifest.json is refused by the parser") {
  temp_dir dir;
  checksummed_checkpoint(dir.path());
  const std::string path = manifest_path(dir.path());
  const std::string text = ck::read_small_file(path);
  REQUIRE_NOTHROW(ck::manifest::parse(text, path));
  int tried = 0, accepted = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const char digit = c >= '0' && c <= '9' ? char('0' + (c - '0' + 1) % 10) : c;
    for (int way = 0; way < 5; ++way) {
      std::string m = text;
      if (way == 0) m[i] = char(c ^ 0x01);  // 0 <-> 1, 2 <-> 3, e <-> d, " <-> #, ...
      if (way == 1) m[i] = digit;           // the next digit
      if (way == 2) m[i] = c == ' ' ? '\t' : ' ';
      if (way == 3) m.erase(i, 1);
      if (way == 4) m.insert(i, 1, ' ');
      if (m == text) continue;
      ++tried;
      try {
        ck::manifest::parse(m, path);
        ++accepted;
        INFO("byte " << i << " ('" << c << "'), change " << way);
        FAIL_CHECK("a changed manifest was accepted");
      } catch (const zshard::error& e) {
        CHECK(std::string(e.what()).find(path) != std::string::npos);
      }
    }
  }
  MESSAGE(tried << " single-byte changes of a " << text.size() << "-byte manifest, " << accepted << " accepted");
  CHECK(accepted == 0);
}

TEST_CASE("manifest checksum: a changed digit of the run state is refused on every rank, the engine untouched") {
  temp_dir dir;
  checksummed_checkpoint(dir.path());
  const std::string path = manifest_path(dir.path());
  const std::string good = ck::read_small_file(path);
  // the first digit of each value (one that a load's range checks cannot tell from a real one)
  for (const std::string key : {"\"lr\": ", "\"step\": ", "\"good_steps_in_row\": ", "\"update_counts\": [", "\"crc32c\": "}) {
    INFO(key);
    std::string m = good;
    std::size_t at = m.find(key);
    REQUIRE(at != std::string::npos);
    at = m.find_first_of("0123456789", at + key.size());
    m[at] = m[at] == '1' ? '2' : '1';
    ck::write_small_file(path, m);
    const std::string e = checksum_failed_load(dir.path());
    CHECK(e.find("manifest.json' fails its checksum") != std::string::npos);
  }
  ck::write_small_file(path, good);
  on_ranks(2, scaled_options(), [&](auto& eng, const toy::ids&) {
    const auto info = ck::load(eng, dir.path());
    CHECK(info.manifest_verified);
    CHECK(eng.lr() == 3e-3f);
    return 0;
  });
}

TEST_CASE("manifest checksum: a version 2 manifest still loads and the log says it has none; versions 3 and 4 need it") {
  temp_dir dir;
  const full_state saved = checksummed_checkpoint(dir.path());
  const std::string path = manifest_path(dir.path());
  const std::string good = ck::read_small_file(path);
  // the file is JSON as it was, with one more field, last
  nlohmann::json j = nlohmann::json::parse(good);
  CHECK(j["version"] == ck::manifest_version);
  CHECK(j["manifest_crc32c"].is_number_unsigned());
  CHECK(good.ends_with("\n \"manifest_crc32c\": " + std::to_string(j["manifest_crc32c"].get<std::uint64_t>()) + "\n}\n"));
  j.erase("manifest_crc32c");
  // what a version 3 or 4 save would be without it: refused
  for (int version : {3, 4}) {
    j["version"] = version;
    ck::write_small_file(path, j.dump(1));
    CHECK(checksum_failed_load(dir.path()).find("format version " + std::to_string(version) +
                                                " without \"manifest_crc32c\"") != std::string::npos);
  }
  // what zshard wrote before format 3: loads, bit for bit, and says what it lacks
  j["version"] = 2;
  ck::write_small_file(path, j.dump(1));
  std::mutex mu;
  std::vector<std::string> notes;
  const full_state loaded = on_ranks(2, scaled_options([&](const std::string& line) {
                                       std::lock_guard lock(mu);
                                       if (line.find("checkpoint") != std::string::npos) notes.push_back(line);
                                     }),
                                     [&](auto& eng, const toy::ids&) {
                                       const auto info = ck::load(eng, dir.path());
                                       CHECK(!info.manifest_verified);
                                       CHECK(info.update_counts_restored);
                                       return gather_all(eng);
                                     });
  CHECK(same_bits(saved, loaded));
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("(format version 2) has no checksum of its manifest") != std::string::npos);
  CHECK(notes[0].find("update counts") == std::string::npos);
  CHECK(notes[0].find("writes format 4") != std::string::npos);
  // a version 2 manifest that does carry a checksum is held to it (a version digit changed)
  std::string v2 = good;
  v2.replace(v2.find("\"version\": 4"), 12, "\"version\": 2");
  ck::write_small_file(path, v2);
  CHECK(checksum_failed_load(dir.path()).find("fails its checksum") != std::string::npos);
}

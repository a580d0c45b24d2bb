// Bad input: a truncated file, a flipped byte, a manifest of another model, a missing rank
// file, an unwritable directory, a write failure in the middle of a save (a full disk), a
// crash's leftovers — each a clear error naming the file, on every rank, and a load that
// failed leaves the engine exactly as it was. A slow disk does not trip the communicator's
// timeout. keep_last rotation and the `latest` pointer.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
namespace fs = std::filesystem;
using namespace ckpt_test;
using zshard::dtype;

namespace {

// Trains 2 steps at world 3 and saves: the checkpoint the tests damage.
full_state make_checkpoint(const std::string& dir) {
  return on_ranks(3, engine_options(), [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, toy::config{}, 0, 2);
    ck::save(eng, dir);
    return gather_all(eng);
  });
}

// Loads `path` into a trained engine at world `world`; returns the error every rank saw (they
// must agree) and checks the engine is untouched.
std::string failed_load(const std::string& path, int world = 2, const toy::config& mc = {},
                        const ck::load_options& lo = {}) {
  rank_errors errors;
  on_ranks(
      world, engine_options(),
      [&](auto& eng, const toy::ids& id) {
        train_steps(eng, id, mc, 0, 1);
        errors.add(load_error_untouched(eng, path, lo));
        train_steps(eng, id, mc, 1, 1);  // and still usable
        return 0;
      },
      mc);
  const std::string e = errors.agreed(world);
  CHECK(!e.empty());
  return e;
}

std::string only_checkpoint(const std::string& dir) { return ck::resolve_checkpoint(dir); }

}  // namespace

TEST_CASE("a truncated rank file is refused, naming it; the engine is untouched") {
  temp_dir dir;
  make_checkpoint(dir.path());
  const std::string f = only_checkpoint(dir.path()) + "/rank-00001.safetensors";
  fs::resize_file(f, fs::file_size(f) - 7);
  const std::string e = failed_load(dir.path());
  CHECK(e.find("rank-00001.safetensors") != std::string::npos);
  CHECK((e.find("truncated") != std::string::npos));
}

namespace {
void flip_byte(const std::string& f, std::streamoff from_end) {
  std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
  char c;
  s.seekg(-from_end, std::ios::end);
  s.get(c);
  s.seekp(-from_end, std::ios::end);
  s.put(char(c ^ 0x10));
}
}  // namespace

TEST_CASE("a flipped byte fails the checksum, naming the file; verify_before_loading leaves the engine untouched") {
  temp_dir dir;
  make_checkpoint(dir.path());
  flip_byte(only_checkpoint(dir.path()) + "/rank-00002.safetensors", 3);
  const std::string e = failed_load(dir.path(), 4, {}, {.verify_before_loading = true});
  CHECK(e.find("rank-00002.safetensors") != std::string::npos);
  CHECK(e.find("fails its checksum") != std::string::npos);
  CHECK(e.find("partly loaded") == std::string::npos);
}

TEST_CASE("a flipped byte found while loading (the default, one pass): every rank fails alike, a good load recovers") {
  temp_dir dir;
  const full_state saved = make_checkpoint(dir.path());
  const std::string c = only_checkpoint(dir.path());
  // bytes of tensor data: the last and a middle one of files that their verifier reads alone
  // (world 3, unchanged layout), and one that rank 2 of 4 verifies while ranks 0-2 load pieces
  // of the file (resharded)
  for (auto [file, from_end, world] : {std::tuple{"rank-00001.safetensors", std::streamoff(5), 3},
                                       {"rank-00000.safetensors", std::streamoff(0), 3},
                                       {"rank-00002.safetensors", std::streamoff(3), 4}}) {
    INFO(file << " byte " << from_end << " at world " << world);
    const std::string f = c + "/" + file;
    const std::string copy = dir / "copy";
    fs::copy_file(f, copy, fs::copy_options::overwrite_existing);
    const std::uint64_t data_bytes = fs::file_size(f) - 8 - ck::safetensors_file(f).header_text().size();
    flip_byte(f, from_end > 0 ? from_end : std::streamoff(data_bytes / 2 + 1));
    std::mutex mu;
    std::vector<std::string> errors;
    const full_state recovered = on_ranks(world, engine_options(), [&](auto& eng, const toy::ids&) {
      std::string what;
      try {
        ck::load(eng, dir.path());
      } catch (const zshard::error& e) {
        what = e.what();
      }
      {
        std::lock_guard lock(mu);
        errors.push_back(what);
      }
      eng.comm().barrier();
      if (eng.comm().rank() == 0) fs::copy_file(copy, f, fs::copy_options::overwrite_existing);
      eng.comm().barrier();
      CHECK(ck::load(eng, dir.path()).step == 2);
      return gather_all(eng);
    });
    REQUIRE(errors.size() == std::size_t(world));
    for (const auto& e : errors) CHECK(e == errors[0]);
    CHECK(errors[0].find(file) != std::string::npos);
    CHECK(errors[0].find("fails its checksum") != std::string::npos);
    CHECK(errors[0].find("partly loaded") != std::string::npos);
    CHECK(errors[0].find("verify_before_loading") != std::string::npos);
    CHECK(same_bits(saved, recovered));
  }
}

TEST_CASE("a manifest of another model lists every difference at once") {
  temp_dir dir;
  make_checkpoint(dir.path());
  toy::config other;
  other.layers = 2;
  other.dim = 6;
  other.name = "student";
  const std::string e = failed_load(dir.path(), 2, other);
  CHECK(e.find("is a checkpoint of another model than model_spec 'student' (#") != std::string::npos);
  CHECK(e.find("manifest.json") != std::string::npos);
  CHECK(e.find("unexpected in the checkpoint: 'W2'") != std::string::npos);
  CHECK(e.find("shape of 'E'") != std::string::npos);
  CHECK(e.find("shape of 'W0'") != std::string::npos);
}

TEST_CASE("a missing rank file and a damaged manifest are refused, naming them") {
  temp_dir dir;
  make_checkpoint(dir.path());
  const std::string c = only_checkpoint(dir.path());
  fs::rename(c + "/rank-00000.safetensors", c + "/moved");
  CHECK(failed_load(dir.path(), 3).find("rank-00000.safetensors") != std::string::npos);
  fs::rename(c + "/moved", c + "/rank-00000.safetensors");
  ck::write_small_file(c + "/manifest.json", "{\"format\": \"zshard-checkpoint\", \"version\": 1");
  CHECK(failed_load(dir.path()).find("not a valid zshard checkpoint manifest") != std::string::npos);
  CHECK(failed_load(dir / "nowhere").find("no checkpoint at") != std::string::npos);
}

TEST_CASE("an unwritable directory fails the save on every rank before anything is written") {
  temp_dir dir;
  ck::write_small_file(dir / "a_file", "x");
  const std::string target = dir / "a_file/checkpoints";
  std::mutex mu;
  std::vector<std::string> errors;
  on_ranks(3, engine_options(), [&](auto& eng, const toy::ids&) {
    try {
      ck::save(eng, target);
    } catch (const zshard::error& e) {
      CHECK(e.kind() == zshard::error_kind::io);
      std::lock_guard lock(mu);
      errors.push_back(e.what());
    }
    return 0;
  });
  REQUIRE(errors.size() == 3);
  CHECK(errors[0].find(target) != std::string::npos);
}

TEST_CASE("a write failure in the middle of a save (full disk) fails it everywhere; the previous checkpoint loads") {
  temp_dir dir;
  const toy::config mc{};
  const full_state first = on_ranks(3, engine_options(), [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, mc, 0, 2);
    ck::save(eng, dir.path(), {.user_state = "first"});
    const full_state at_save = gather_all(eng);
    train_steps(eng, id, mc, 2, 2);
    ck::save_options o;
    o.user_state = "second";
    o.chunk_bytes = 1024;
    o.io_timeout = std::chrono::seconds(20);
    const int rank = eng.comm().rank();
    o.hook = [rank](const ck::io_event& e) {
      return rank == 1 && e.call == ck::io_call::write && e.offset > 600 ? ENOSPC : 0;
    };
    std::string what;
    try {
      ck::save(eng, dir.path(), o);
    } catch (const zshard::error& e) {
      what = e.what();
    }
    CHECK(what.find("No space left on device") != std::string::npos);
    CHECK(what.find("rank-00001.safetensors") != std::string::npos);
    CHECK(what.find("(rank 1)") != std::string::npos);
    return at_save;
  });
  CHECK(ck::list_checkpoints(dir.path()).size() == 1);
  const full_state loaded = on_ranks(3, engine_options(), [&](auto& eng, const toy::ids&) {
    CHECK(ck::load(eng, dir.path()).user_state == "first");
    return gather_all(eng);
  });
  CHECK(same_bits(first, loaded));
  // the next save clears the failed one's leftovers
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    ck::save(eng, dir.path());
    return 0;
  });
  int leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) leftovers += e.path().filename().string().ends_with(".tmp");
  CHECK(leftovers == 0);
}

TEST_CASE("a crash mid-save leaves the previous checkpoint and latest intact") {
  temp_dir dir;
  const full_state saved = make_checkpoint(dir.path());
  // what a crash between writing and renaming leaves: a temporary directory with a partial file
  fs::create_directories(dir / ".step-0000000009.tmp");
  ck::write_small_file(dir / ".step-0000000009.tmp/rank-00000.safetensors", "partial");
  const full_state loaded = on_ranks(3, engine_options(), [&](auto& eng, const toy::ids&) {
    CHECK(ck::load(eng, dir.path()).step == 2);
    return gather_all(eng);
  });
  CHECK(same_bits(saved, loaded));
}

TEST_CASE("a slow disk does not trip the communicator's timeout") {
  temp_dir dir;
  using namespace std::chrono_literals;
  // the world's collectives time out after 300 ms; rank 2 takes over a second to write
  on_ranks(
      3, engine_options(),
      [&](auto& eng, const toy::ids& id) {
        train_steps(eng, id, toy::config{}, 0, 1);
        ck::save_options o;
        const int rank = eng.comm().rank();
        o.hook = [rank](const ck::io_event& e) {
          if (rank == 2 && e.call == ck::io_call::write) std::this_thread::sleep_for(60ms);
          return 0;
        };
        const auto t0 = std::chrono::steady_clock::now();
        ck::save(eng, dir.path(), o);
        CHECK(std::chrono::steady_clock::now() - t0 > 600ms);
        train_steps(eng, id, toy::config{}, 1, 1);  // collectives still work
        return 0;
      },
      toy::config{}, 300ms);
  CHECK(ck::list_checkpoints(dir.path()).size() == 1);
}

TEST_CASE("keep_last rotation, latest, and saving the same step twice") {
  temp_dir dir;
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids& id) {
    for (int k = 0; k < 4; ++k) {
      train_steps(eng, id, toy::config{}, k, 1);
      const auto s = ck::save(eng, dir.path(), {.keep_last = 2});
      CHECK(s.step == k + 1);
    }
    const auto again = ck::save(eng, dir.path(), {.keep_last = 2});  // step 4 again
    CHECK(again.path.ends_with("step-0000000004.1"));
    return 0;
  });
  const auto left = ck::list_checkpoints(dir.path());
  REQUIRE(left.size() == 2);
  CHECK(left[0].name == "step-0000000004");
  CHECK(left[1].name == "step-0000000004.1");
  CHECK(ck::read_small_file(dir / "latest") == "step-0000000004.1\n");
  CHECK(ck::resolve_checkpoint(dir.path()) == dir / "step-0000000004.1");
}

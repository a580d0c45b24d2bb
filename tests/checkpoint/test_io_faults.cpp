// File-system faults under a load, an export and a save, injected at single calls through the
// io_hook seam (io_hook.hpp) or made directly: a rank file truncated while it is read is an
// error naming it, never a SIGBUS; a full disk or a failing marker on one rank reaches every
// rank at once with the real cause (the file and the system's reason) instead of a wait of
// io_timeout that blames "rank N did not finish writing".
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
namespace fs = std::filesystem;
using namespace ckpt_test;
using namespace std::chrono_literals;

namespace {

// A checkpoint of 2 ranks after one step; returns its directory.
std::string faulted_checkpoint(const std::string& dir) {
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, toy::config{}, 0, 1);
    ck::save(eng, dir);
    return 0;
  });
  return ck::resolve_checkpoint(dir);
}

struct plain_chunk {  // the Staging read_pieces takes
  std::vector<char> v = std::vector<char>(4096);
  void* data() { return v.data(); }
  std::size_t bytes() { return v.size(); }
};

}  // namespace

TEST_CASE("a rank file truncated after it was opened is an error naming it, never a SIGBUS") {
  temp_dir dir;
  const std::string c = faulted_checkpoint(dir.path());
  const ck::manifest m = ck::manifest::parse(ck::read_small_file(c + "/manifest.json"), "manifest.json");
  const std::string f0 = c + "/rank-00000.safetensors", copy = dir / "copy";
  fs::copy_file(f0, copy);
  for (int way = 0; way < 3; ++way) {
    INFO("way " << way);
    fs::copy_file(copy, f0, fs::copy_options::overwrite_existing);
    ck::safetensors_file f(f0);  // its size and header are read here
    const ck::tensor_entry& t = f.header().tensors.back();
    fs::resize_file(f0, 0);  // then someone truncates it
    std::vector<float> dst(t.numel());
    std::string what;
    try {
      if (way == 0) ck::verify_file(f, m.files[0]);  // verify_before_loading, export_checkpoint
      if (way > 0) {  // the one-pass verified load (way 1) and the plain one (way 2)
        ck::load_piece pc;
        pc.offset = t.begin;
        pc.numel = t.numel();
        pc.direct = reinterpret_cast<char*>(dst.data());
        plain_chunk chunk;
        ck::read_pieces(f, {pc}, way == 1 ? &m.files[0] : nullptr, chunk);
      }
    } catch (const zshard::error& e) {
      what = e.what();
    }
    CHECK(what.find(f0) != std::string::npos);
    CHECK(what.find("truncated file") != std::string::npos);
  }
}

TEST_CASE("a rank file truncated in the middle of a load or an export: every rank fails alike, naming it") {
  temp_dir dir;
  const std::string c = faulted_checkpoint(dir.path());
  const std::string f1 = c + "/rank-00001.safetensors", copy = dir / "copy";
  fs::copy_file(f1, copy);
  // truncated at the first read of tensor data (the header is read at offsets 0 and 8)
  auto truncate_at_data = [&f1](std::shared_ptr<std::atomic<bool>> done) {
    return [&f1, done](const ck::io_event& e) {
      if (e.call == ck::io_call::read && e.path == f1 && e.offset > 8 && !done->exchange(true)) fs::resize_file(f1, 100);
      return 0;
    };
  };
  std::mutex mu;
  std::vector<std::string> errors;
  auto done = std::make_shared<std::atomic<bool>>(false);
  on_ranks(2, engine_options(), [&](auto& eng, const toy::ids&) {
    std::string what;
    try {
      ck::load(eng, dir.path(), {.hook = truncate_at_data(done)});
    } catch (const zshard::error& e) {
      what = e.what();
    }
    std::lock_guard lock(mu);
    errors.push_back(what);
    return 0;
  });
  REQUIRE(errors.size() == 2);
  CHECK(errors[0] == errors[1]);
  CHECK(errors[0].find("rank-00001.safetensors") != std::string::npos);
  CHECK(errors[0].find("truncated file") != std::string::npos);
  CHECK(errors[0].find("partly loaded") != std::string::npos);

  fs::copy_file(copy, f1, fs::copy_options::overwrite_existing);
  ck::export_options eo;
  eo.hook = truncate_at_data(std::make_shared<std::atomic<bool>>(false));
  CHECK_THROWS_WITH_AS(ck::export_checkpoint(dir.path(), dir / "out.safetensors", eo),
                       doctest::Contains("rank-00001.safetensors' ends at byte"), zshard::error);
  CHECK(!fs::exists(dir / "out.safetensors"));
}

namespace {

// The disk of rank `full_rank` (this is rank `rank`) fills up at its first write past byte
// `after` of a file whose path holds `file`: from then on every call that needs space fails
// with ENOSPC (creating, writing, sizing, syncing, closing a file, creating a directory);
// renames and removals, which need none, still work.
ck::io_hook full_disk(int rank, int full_rank, const std::string& file, std::uint64_t after) {
  auto full = std::make_shared<bool>(false);  // this rank's hook only: one thread
  return [=](const ck::io_event& e) {
    if (rank != full_rank) return 0;
    if (e.call == ck::io_call::write && e.offset > after && e.path.find(file) != std::string::npos) *full = true;
    if (!*full) return 0;
    switch (e.call) {
      case ck::io_call::create:
      case ck::io_call::write:
      case ck::io_call::truncate:
      case ck::io_call::sync:
      case ck::io_call::close:
      case ck::io_call::make_directory: return ENOSPC;
      default: return 0;
    }
  };
}

struct timed_error {
  std::string what;
  std::chrono::steady_clock::duration took{};
};

// Runs `op(eng, rank)` on 3 thread ranks after one step; every rank's error and how long it took.
template <class Op>
std::vector<timed_error> failing_on_ranks(Op&& op) {
  std::mutex mu;
  std::vector<timed_error> out(3);
  on_ranks(3, engine_options(), [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, toy::config{}, 0, 1);
    timed_error r;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      op(eng, eng.comm().rank());
    } catch (const zshard::error& e) {
      r.what = e.what();
    }
    r.took = std::chrono::steady_clock::now() - t0;
    std::lock_guard lock(mu);
    out[std::size_t(eng.comm().rank())] = r;
    return 0;
  });
  return out;
}

// Every rank failed alike and at once (not at io_timeout), naming the failing rank and `words`.
void check_failed_at_once(const std::vector<timed_error>& errors, int failing, const std::string& words) {
  for (const auto& e : errors) {
    INFO(e.what);
    CHECK(e.what == errors[0].what);
    CHECK(e.what.find("(rank " + std::to_string(failing) + ")") != std::string::npos);
    CHECK(e.what.find(words) != std::string::npos);
    CHECK(e.took < 5s);
  }
}

}  // namespace

TEST_CASE("a full disk on one rank fails the save on every rank at once, with the file and ENOSPC") {
  temp_dir dir;
  const auto errors = failing_on_ranks([&](auto& eng, int rank) {
    ck::save(eng, dir.path(), {.chunk_bytes = 1024, .io_timeout = 10s, .hook = full_disk(rank, 1, "rank-00001.safetensors", 600)});
  });
  check_failed_at_once(errors, 1, "rank-00001.safetensors': No space left on device");
  CHECK(ck::list_checkpoints(dir.path()).empty());
}

TEST_CASE("a full disk on one rank fails an export on every rank at once, with the file and ENOSPC") {
  temp_dir dir;
  const std::string out = dir / "model.safetensors";
  const auto errors = failing_on_ranks([&](auto& eng, int rank) {
    ck::export_options o;
    o.chunk_bytes = 64;
    o.io_timeout = 10s;
    o.hook = full_disk(rank, 2, "data.safetensors", 100);
    ck::export_engine(eng, out, o);
  });
  check_failed_at_once(errors, 2, "No space left on device");
  CHECK(!fs::exists(out));
}

TEST_CASE("a marker that cannot be posted (EIO on its rename) fails the save on every rank at once, naming it") {
  temp_dir dir;
  const auto errors = failing_on_ranks([&](auto& eng, int rank) {
    ck::save_options o;
    o.io_timeout = 10s;
    o.hook = [rank](const ck::io_event& e) {
      return rank == 1 && e.call == ck::io_call::rename && e.target && e.target->ends_with("rank-00001.done") ? EIO : 0;
    };
    ck::save(eng, dir.path(), o);
  });
  check_failed_at_once(errors, 1, "rank-00001.done': Input/output error");
  CHECK(ck::list_checkpoints(dir.path()).empty());
}

TEST_CASE("a marker that can be neither renamed nor removed: that rank fails at once, the others at io_timeout") {
  temp_dir dir;
  const auto errors = failing_on_ranks([&](auto& eng, int rank) {
    ck::save_options o;
    o.io_timeout = 5s;  // rank 1's own failure must come well before it, even under a sanitizer
    o.hook = [rank](const ck::io_event& e) {
      const bool marker = e.path.find("rank-00001.pending") != std::string::npos;
      return rank == 1 && marker && (e.call == ck::io_call::rename || e.call == ck::io_call::remove) ? EIO : 0;
    };
    ck::save(eng, dir.path(), o);
  });
  CHECK(errors[1].what.find("rank-00001.done': Input/output error") != std::string::npos);
  CHECK(errors[1].what.find("the other ranks wait") != std::string::npos);
  CHECK(errors[1].took < 5s);  // at once: not after waiting for the others
  for (int r : {0, 2}) {
    INFO(errors[std::size_t(r)].what);
    CHECK(errors[std::size_t(r)].what.find("rank(s) 1 did not finish writing within 5000 ms") != std::string::npos);
    CHECK(errors[std::size_t(r)].took >= 5s);
  }
  CHECK(ck::list_checkpoints(dir.path()).empty());
}

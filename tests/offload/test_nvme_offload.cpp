// The NVMe tier of the host Offloader (offload_config::optimizer_state = nvme,
// offload/nvme_state.hpp): master, m and v in one file per rank, updated chunk by chunk. Training
// gives bit for bit the parameters of the same Offloader with the state in memory (worlds 1-4,
// activation checkpointing, a no-grad pass, a tied weight; with parameters offloaded too, and
// through the device staging path); the files have the sizes the tier says and go with the
// engine; the ledgers hold the chunk buffers and the files. Failures are real ones: a file-size
// limit (RLIMIT_FSIZE, as a full disk) at construction and in the middle of a step, and a file
// cut short under a running engine. A failed step leaves the last completed step's state and
// working parameters (and the engine's step count) as they were, and training goes on from
// there exactly.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "../checkpoint/test_dir.hpp"
#include "../engine/equivalence_check.hpp"
#include "../engine/hybrid_training.hpp"
#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "offload_fixtures.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/offload/host_adam.hpp"

using namespace zshard;

namespace {

using nvme_policies = test_support::host_offload_policies;
using nvme_device_backend = offload_test::device_like_backend;

toy::train_options nvme_options(int world, dtype t) {
  toy::train_options o = offload_test::offload_options(world, t);
  o.model.dim = 40;  // some thousand elements per rank: several chunks of 1024 at every world size
  return o;
}

void use_nvme(toy::train_options& o, const std::string& dir, std::size_t chunk, int buffers) {
  o.engine.offload.optimizer_state = offload_tier::nvme;
  o.engine.offload.nvme_path = dir;
  o.engine.offload.nvme_chunk_numel = chunk;
  o.engine.offload.nvme_buffer_count = buffers;
}

struct nvme_run_result {
  toy::train_result train;
  std::size_t host_optimizer = 0, nvme_bytes = 0, file_bytes = 0, chunk_bytes = 0, chunks = 0, flat_numel = 0;
  std::uint64_t read = 0, written = 0;
  int buffers = 0;
  bool file_existed = false;
  std::string file;
};

template <class Backend = host_backend>
nvme_run_result nvme_train(const toy::train_options& o) {
  nvme_run_result r;
  offload_test::train_offloaded<nvme_policies, Backend>(o, r.train, [&](auto& eng, Backend&) {
    r.host_optimizer = eng.offloader().state_ledger().current(mem_category::optimizer_state);
    for (param_id p = 0; p < eng.spec().params().size(); ++p)
      if (eng.spec().params()[p].trainable) r.flat_numel += optim::round_up_to_granule(eng.layout(p).shard_numel);
    if (const auto* n = eng.offloader().nvme()) {
      r.nvme_bytes = n->ledger().current(mem_category::optimizer_state);
      r.chunk_bytes = n->chunk_bytes();
      r.chunks = n->chunks();
      r.read = n->step_bytes_read();
      r.written = n->step_bytes_written();
      r.file = n->file()->path();
      r.file_existed = std::filesystem::exists(r.file);
      r.file_bytes = std::filesystem::file_size(r.file);
      r.buffers = int(offload::nvme_buffers(o.engine.offload, n->chunks()));
    }
  });
  return r;
}

void nvme_check_bitwise(const toy::train_result& got, const toy::train_result& want, const std::string& what) {
  offload_test::check_same_params(got, want, what);
  INFO(what);
  // the reported norm sums tiles cut at chunk boundaries: the same sum, grouped otherwise
  for (std::size_t s = 0; s < got.reports.size(); ++s)
    CHECK(got.reports[s].grad_norm == doctest::Approx(want.reports[s].grad_norm).epsilon(1e-12));
}

// A file-size limit for this process (as a full disk: writes past it fail with EFBIG); SIGXFSZ,
// which the kernel also sends, is ignored while it is set.
class file_size_limit {
 public:
  explicit file_size_limit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit l = saved_;
    l.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &l) == 0);
  }
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_);
  }

 private:
  rlimit saved_{};
  void (*old_)(int) = nullptr;
};

}  // namespace

TEST_CASE(
    "optimizer state on NVMe trains bit for bit like in memory: worlds 1-4, checkpointing, no-grad, tied weight") {
  ckpt_test::temp_dir dir;
  for (int world = 1; world <= 4; ++world) {
    for (dtype t : {dtype::f32, dtype::bf16}) {
      const std::string what = "world " + std::to_string(world) + ", " + std::string(to_string(t));
      auto o = nvme_options(world, t);
      const auto want = nvme_train(o);
      use_nvme(o, dir.path(), 1024, world == 2 ? 3 : 4);  // several chunks of 1024 per rank
      const auto got = nvme_train(o);
      nvme_check_bitwise(got.train, want.train, what);
      INFO(what);
      // the file: two slots of whole chunks, there while the engine is, gone after it
      CHECK(got.chunks == (got.flat_numel + 1023) / 1024);
      CHECK(got.chunks >= 2);
      CHECK(got.chunk_bytes == 12 * 1024);
      CHECK(got.file_existed);
      CHECK(got.file_bytes == 2 * got.chunks * got.chunk_bytes);
      CHECK(!std::filesystem::exists(got.file));
      // the ledgers: the files in the nvme ledger, the chunk buffers (not the state) in the host one
      CHECK(got.nvme_bytes == got.file_bytes);
      CHECK(got.host_optimizer == std::size_t(got.buffers) * got.chunk_bytes);
      CHECK(want.host_optimizer == 3 * 4 * got.flat_numel);
      // every step read and wrote the whole state once
      CHECK(got.read == std::uint64_t(o.steps) * got.chunks * got.chunk_bytes);
      CHECK(got.written == got.read);
    }
  }
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("NVMe optimizer state with parameters offloaded too, and through the device staging path") {
  ckpt_test::temp_dir dir;
  for (int world : {1, 3}) {
    auto o = nvme_options(world, dtype::bf16);
    o.engine.offload.host_tile_numel = 32;
    o.engine.offload.host_staging_numel = 64;
    const auto want = nvme_train<nvme_device_backend>(o);
    use_nvme(o, dir.path(), 1024, 3);
    nvme_check_bitwise(nvme_train<nvme_device_backend>(o).train, want.train, "device path, world " + std::to_string(world));
    o.engine.offload.params = offload_tier::host;
    nvme_check_bitwise(nvme_train<nvme_device_backend>(o).train, want.train,
                  "device path, parameters offloaded, world " + std::to_string(world));
    nvme_check_bitwise(nvme_train<host_backend>(o).train, want.train,
                  "host, parameters offloaded, world " + std::to_string(world));
  }
}

TEST_CASE("NVMe tier: a full disk at construction is an error naming the file and the bytes, leaving nothing") {
  ckpt_test::temp_dir dir;
  auto o = nvme_options(1, dtype::f32);
  use_nvme(o, dir.path(), 1024, 3);
  toy::ids id;
  host_backend backend;
  null_comm comm(0, 1);
  {
    file_size_limit limit(4096);
    const error e = test_support::thrown_by([&] {
      engine<host_backend, null_comm, nvme_policies> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
    });
    CHECK(e.kind() == error_kind::io);
    const std::string msg = e.what();
    CHECK(msg.find(dir.path() + "/zshard-optimizer-r0-") != std::string::npos);
    CHECK(msg.find("cannot allocate") != std::string::npos);
    CHECK(msg.find("File too large") != std::string::npos);
  }
  CHECK(std::filesystem::is_empty(dir.path()));  // the half-made file is removed
  CHECK(backend.ledger().total_current() == 0);
}

TEST_CASE("NVMe tier: a write failing in the middle of a step leaves the last step's state, working values and count") {
  ckpt_test::temp_dir dir;
  const int world = 2;
  auto o = nvme_options(world, dtype::bf16);
  o.micro_batches = 1;
  use_nvme(o, dir.path(), 1024, 3);
  auto mem = o;
  mem.engine.offload.optimizer_state = offload_tier::host;
  // Per rank, after steps 2 and 3 of the in-memory run: every field of every shard.
  struct shards {
    std::vector<std::vector<float>> master, m, v, working;
  };
  auto read_all = [](auto& eng) {
    shards s;
    for (param_id p = 0; p < eng.spec().params().size(); ++p) {
      const std::size_t n = eng.layout(p).shard_numel;
      std::vector<float> w(n);
      std::vector<std::uint16_t> half(n);
      if (eng.store()[p].type == dtype::f32)
        eng.read_shard(p, state_field::working, 0, w.data(), n);
      else {
        eng.read_shard(p, state_field::working, 0, half.data(), n);
        convert(half.data(), eng.store()[p].type, w.data(), dtype::f32, n);
      }
      s.working.push_back(w);
      if (!eng.spec().params()[p].trainable) continue;
      for (auto [f, into] :
           {std::pair{state_field::master, &s.master}, {state_field::m, &s.m}, {state_field::v, &s.v}}) {
        std::vector<float> x(n);
        eng.read_shard(p, f, 0, x.data(), n);
        into->push_back(x);
      }
    }
    return s;
  };
  auto step_once = [&](auto& eng, int step, int rank) {
    const toy::batch global = toy::make_batch(o.model.vocab, std::uint64_t(step), world * o.rows);
    toy::run_checkpointed_micro_batch(eng, o.model, toy::ids_of(eng.spec(), o.model),
                                      toy::slice(global, rank * o.rows, o.rows));
    return eng.step();
  };
  std::vector<shards> after2(world), after3(world), failed(world), resumed(world);
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    toy::ids id;
    engine<host_backend, thread_comm, nvme_policies> eng(backend, comm, toy::make_spec(mem.model, id), mem.engine);
    for (int s = 0; s < 2; ++s) step_once(eng, s, comm.rank());
    after2[comm.rank()] = read_all(eng);
    step_once(eng, 2, comm.rank());
    after3[comm.rank()] = read_all(eng);
  });
  std::vector<std::string> messages(world);
  std::vector<std::int64_t> count_after_failure(world);
  std::mutex mu;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    toy::ids id;
    engine<host_backend, thread_comm, nvme_policies> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
    const auto* n = eng.offloader().nvme();
    for (int s = 0; s < 2; ++s) step_once(eng, s, comm.rank());
    REQUIRE(n->active_slot() == 0);  // the third step writes slot 1: chunk k at (2k + 1) * chunk_bytes
    REQUIRE(n->chunks() >= 2);
    comm.barrier();
    std::unique_ptr<file_size_limit> limit;
    if (comm.rank() == 0) limit = std::make_unique<file_size_limit>(3 * n->chunk_bytes());
    comm.barrier();  // chunk 0 of slot 1 fits under the limit, chunk 1 starts at it
    try {
      step_once(eng, 2, comm.rank());
    } catch (const error& e) {
      std::lock_guard lock(mu);
      messages[comm.rank()] = e.what();
    }
    comm.barrier();
    limit.reset();
    CHECK(n->active_slot() == 0);
    eng.discard_gradients();  // the micro-batch of the failed step
    count_after_failure[comm.rank()] = eng.steps_taken();
    failed[comm.rank()] = read_all(eng);
    step_once(eng, 2, comm.rank());  // the step again, from the intact state
    resumed[comm.rank()] = read_all(eng);
  });
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const std::string& msg = messages[r];
    CHECK(msg.find("write of 12288 bytes at offset ") != std::string::npos);
    CHECK(msg.find(dir.path() + "/zshard-optimizer-r" + std::to_string(r) + "-") != std::string::npos);
    CHECK(msg.find("File too large") != std::string::npos);
    CHECK(count_after_failure[r] == 2);
    auto same = [](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
      return true;
    };
    CHECK(same(failed[r].master, after2[r].master));
    CHECK(same(failed[r].m, after2[r].m));
    CHECK(same(failed[r].v, after2[r].v));
    CHECK(same(failed[r].working, after2[r].working));
    CHECK(!same(after3[r].working, after2[r].working));  // the step would have changed them
    CHECK(same(resumed[r].master, after3[r].master));
    CHECK(same(resumed[r].v, after3[r].v));
    CHECK(same(resumed[r].working, after3[r].working));
  }
}

TEST_CASE("NVMe tier: a state file cut short under a running engine fails the step with the file and the offset") {
  ckpt_test::temp_dir dir;
  auto o = nvme_options(1, dtype::f32);
  o.micro_batches = 1;
  use_nvme(o, dir.path(), 1024, 3);
  run_ranks(1, [&](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    engine<host_backend, thread_comm, nvme_policies> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
    const auto* n = eng.offloader().nvme();
    toy::run_checkpointed_micro_batch(eng, o.model, id, toy::make_batch(o.model.vocab, 0, o.rows));
    eng.step();
    REQUIRE(n->active_slot() == 1);
    REQUIRE(::truncate(n->file()->path().c_str(), off_t(n->chunk_bytes())) == 0);  // slot 1 is gone
    toy::run_checkpointed_micro_batch(eng, o.model, id, toy::make_batch(o.model.vocab, 1, o.rows));
    const error e = test_support::thrown_by([&] { eng.step(); });
    CHECK(e.kind() == error_kind::io);
    const std::string msg = e.what();
    CHECK(msg.find("read of 12288 bytes at offset 12288 of NVMe state file '" + n->file()->path() + "'") !=
          std::string::npos);  // chunk 0 of slot 1
    CHECK(msg.find("end of file") != std::string::npos);
    CHECK(eng.steps_taken() == 1);
  });
}

TEST_CASE("NVMe tier settings are checked by name") {
  auto fails = [](offload_config c, const char* words) {
    const error e = test_support::thrown_by([&] { c.validate(); });
    CHECK(e.kind() == error_kind::config);
    CHECK(std::string(e.what()).find(words) != std::string::npos);
  };
  fails({.optimizer_state = offload_tier::nvme}, "without nvme_path");
  fails({.optimizer_state = offload_tier::nvme, .nvme_path = "/tmp", .nvme_chunk_numel = 1000},
        "nvme_chunk_numel = 1000");
  fails({.optimizer_state = offload_tier::nvme, .nvme_path = "/tmp", .nvme_buffer_count = 2}, "nvme_buffer_count = 2");
  fails({.params = offload_tier::nvme}, "params = nvme");
  fails({.optimizer_state = offload_tier::device}, "optimizer_state = device");
  // the device Offloader refuses the NVMe tier by name
  toy::ids id;
  host_backend backend;
  null_comm comm(0, 1);
  engine_config cfg;
  cfg.offload.optimizer_state = offload_tier::nvme;
  cfg.offload.nvme_path = "/tmp";
  const std::string msg = test_support::message_of(
      [&] { engine<host_backend, null_comm> eng(backend, comm, toy::make_spec({}, id), cfg); });
  CHECK(msg.find("optimizer_state = nvme with offload::on_device") != std::string::npos);
}

// checkpoint_io: how close sharded save and load come to the disk, and what a load costs in
// host memory. In one run, on the same directory (default: the system temp dir, override with
// --dir), with the same rank threads:
//   save   checkpoint::save of a 2-rank engine (rank files + manifest, CRC32C, fsync, rename)
//   write  each rank thread writing the same number of bytes to a plain file (64 MiB write()s, fsync)
//   copy   each rank thread copying that file as `cp` does, then fsync of the copy (`cp` + `sync`)
//   load   checkpoint::load of that checkpoint into a fresh engine: CRC32C verified in the same
//          pass (the default), verified in a pass of its own first (verify_before_loading), or
//          not verified
//   read   each rank thread reading its plain file back (64 MiB pread()s)
// Both sides see the page cache the same way (files just written). Best of --repeats.
// Then: load_pretrained of a model many times larger than its chunk, with the ledger's peak.
// Key figures last: ckpt_save_vs_disk, ckpt_save_vs_cp_sync (target >= 0.9), ckpt_load_vs_disk (target >= 0.8),
// ckpt_load_verify_first_vs_disk, ckpt_load_noverify_vs_disk, load_peak_host_bytes, load_chunk_bytes.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/checkpoint/checkpoint.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"

namespace ck = zshard::checkpoint;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string dir = (std::filesystem::temp_directory_path() / "zshard-checkpoint-io").string();
  int ranks = 2;
  std::int64_t params_m = 16;  // millions of parameters
  int repeats = 3;
};

zshard::model_spec make_model(std::int64_t total) {
  zshard::model_spec spec;
  const std::int64_t layers = 8, per = total / layers;
  for (std::int64_t l = 0; l < layers; ++l) {
    const auto w = spec.add_param("layer" + std::to_string(l) + ".weight", {per / 1024, 1024},
                                  {.init = zshard::init::uniform(-0.1f, 0.1f, std::uint64_t(l))});
    spec.add_module("layer" + std::to_string(l), {w});
  }
  return spec;
}

zshard::engine_config config() {
  zshard::engine_config c;
  c.log = [](const std::string&) {};
  return c;
}

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// One thread per rank, each writing (or reading) `bytes` of its own plain file.
double plain_io(const std::string& dir, int ranks, std::uint64_t bytes, bool write) {
  constexpr std::size_t chunk = std::size_t{64} << 20;
  std::vector<std::thread> threads;
  std::vector<std::vector<char>> bufs;  // allocated and touched before the clock starts
  for (int r = 0; r < ranks; ++r) bufs.emplace_back(chunk, char(r + 1));
  const auto t0 = clock_type::now();
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      std::vector<char>& buf = bufs[std::size_t(r)];
      const std::string path = dir + "/plain-" + std::to_string(r) + ".bin";
      if (write) {
        ck::file_handle f = ck::file_handle::create(path);
        for (std::uint64_t at = 0; at < bytes; at += chunk)
          f.write_all(buf.data(), std::min<std::uint64_t>(chunk, bytes - at));
        f.sync();
        f.close();
      } else {
        ck::file_handle f = ck::file_handle::read_only(path);
        for (std::uint64_t at = 0; at < bytes; at += chunk)
          f.read_at(at, buf.data(), std::min<std::uint64_t>(chunk, bytes - at));
      }
    });
  for (auto& t : threads) t.join();
  return seconds_since(t0);
}

// One thread per rank copying its plain file as `cp` does (std::filesystem::copy_file: the
// kernel's copy_file_range or sendfile where it has one), then syncing the copy to disk, as `sync`.
double copy_and_sync(const std::string& dir, int ranks) {
  std::vector<std::thread> threads;
  const auto t0 = clock_type::now();
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      const std::string from = dir + "/plain-" + std::to_string(r) + ".bin",
                        to = dir + "/copy-" + std::to_string(r) + ".bin";
      std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
      ck::file_handle f = ck::file_handle::read_only(to);
      f.sync();
    });
  for (auto& t : threads) t.join();
  const double t = seconds_since(t0);
  for (int r = 0; r < ranks; ++r) std::filesystem::remove(dir + "/copy-" + std::to_string(r) + ".bin");
  return t;
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir")
      o.dir = v;
    else if (a == "--ranks")
      o.ranks = std::stoi(v);
    else if (a == "--params-m")
      o.params_m = std::stoll(v);
    else if (a == "--repeats")
      o.repeats = std::stoi(v);
    else
      throw std::invalid_argument("unknown option " + a + " (--dir D --ranks N --params-m M --repeats R)");
  }
  std::filesystem::remove_all(o.dir);
  std::filesystem::create_directories(o.dir);
  const zshard::model_spec spec = make_model(o.params_m * 1'000'000);
  const std::string ckpt = o.dir + "/ckpt";
  double best_save = 1e30, best_write = 1e30, best_copy = 1e30, best_read = 1e30;
  double best_load[3] = {1e30, 1e30, 1e30};  // verified in the same pass, verified first, not verified
  const ck::load_options load_modes[3] = {{}, {.verify_before_loading = true}, {.verify_checksums = false}};
  std::uint64_t rank_bytes = 0;
  for (int rep = 0; rep < o.repeats; ++rep) {
    std::filesystem::remove_all(ckpt);
    std::mutex mu;
    zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) {
      zshard::host_backend backend;
      zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, config());
      comm.barrier();
      const auto t0 = clock_type::now();
      const auto s = ck::save(eng, ckpt);
      comm.barrier();
      const double t = seconds_since(t0);
      if (comm.rank() == 0) {
        std::lock_guard lock(mu);
        best_save = std::min(best_save, t);
        rank_bytes = s.rank_bytes;
      }
    });
    best_write = std::min(best_write, plain_io(o.dir, o.ranks, rank_bytes, true));
    best_copy = std::min(best_copy, copy_and_sync(o.dir, o.ranks));
    for (int mode = 0; mode < 3; ++mode)
      zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) {
        zshard::host_backend backend;
        zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, config());
        comm.barrier();
        const auto t0 = clock_type::now();
        ck::load(eng, ckpt, load_modes[mode]);
        comm.barrier();
        const double t = seconds_since(t0);
        if (comm.rank() == 0) {
          std::lock_guard lock(mu);
          best_load[mode] = std::min(best_load[mode], t);
        }
      });
    best_read = std::min(best_read, plain_io(o.dir, o.ranks, rank_bytes, false));
  }
  const double total = double(rank_bytes) * o.ranks / 1e9;
  std::printf(
      "checkpoint_io with %d rank threads, %lld M parameters (f32 working + master + m + v = 16 B/param), "
      "%.3f GB per checkpoint, dir %s, CRC32C %s\n",
      o.ranks, static_cast<long long>(o.params_m), total, o.dir.c_str(),
      ck::crc32c().uses_hardware() ? "SSE4.2" : "table");
  std::printf("%-28s %10s %10s\n", "operation", "time_s", "GB/s");
  auto row = [&](const char* name, double t) { std::printf("%-28s %10.3f %10.2f\n", name, t, total / t); };
  row("save (checkpoint::save)", best_save);
  row("plain write + fsync", best_write);
  row("cp + sync of the same bytes", best_copy);
  row("load, verified (one pass)", best_load[0]);
  row("load, verified first", best_load[1]);
  row("load, no verification", best_load[2]);
  row("plain read", best_read);

  // Peak host memory of a pretrained load: the whole model in one f32 file, a 1 MiB chunk.
  const std::string file = o.dir + "/model.safetensors";
  zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, config());
    ck::export_engine(eng, file);
  });
  constexpr std::size_t chunk = std::size_t{1} << 20;
  std::size_t peak = 0;
  std::mutex mu;
  zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, config());
    backend.ledger().reset_peaks();
    const std::size_t before = backend.ledger().total_current();
    ck::load_pretrained(eng, file, {.chunk_bytes = chunk});
    std::lock_guard lock(mu);
    peak = std::max(peak, backend.ledger().total_peak() - before);
  });
  const auto model_bytes = std::filesystem::file_size(file);
  std::printf(
      "\npretrained load of a %.1f MiB f32 file (%.0fx the chunk) on %d ranks: peak host bytes above the "
      "engine's own state %zu (chunk %zu)\n",
      double(model_bytes) / (1 << 20), double(model_bytes) / chunk, o.ranks, peak, chunk);
  std::filesystem::remove_all(o.dir);
  std::printf("\nckpt_save_vs_disk: %.2f\n", best_write / best_save);
  std::printf("ckpt_save_vs_cp_sync: %.2f\n", best_copy / best_save);
  std::printf("ckpt_load_vs_disk: %.2f\n", best_read / best_load[0]);
  std::printf("ckpt_load_verify_first_vs_disk: %.2f\n", best_read / best_load[1]);
  std::printf("ckpt_load_noverify_vs_disk: %.2f\n", best_read / best_load[2]);
  std::printf("load_peak_host_bytes: %zu\n", peak);
  std::printf("load_chunk_bytes: %zu\n", chunk);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "checkpoint_io: %s\n", e.what());
  return 2;
}

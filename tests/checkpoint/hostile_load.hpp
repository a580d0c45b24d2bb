#pragma once
// A load of a hostile checkpoint, watched: how long it took, how much the process's resident
// memory grew at its peak, every path it opened or read (through load_options::hook), and its
// error. A load that blocks on a FIFO (as loads once did) is freed after a while by opening the
// FIFO's write end, so that a test of it fails instead of hanging.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ckpt_training.hpp"

namespace hostile_load {

// The process's resident bytes now, or at their peak since the last reset_peak_rss (Linux).
inline std::uint64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(line.find(':') + 1)) * 1024;
  return 0;
}
inline std::uint64_t rss_bytes() { return status_kib("VmRSS:"); }
inline std::uint64_t peak_rss_bytes() { return status_kib("VmHWM:"); }
// Starts the peak over at the present resident size (writing 5 to clear_refs, Linux 4.0+),
// after giving back the heap's free memory (else a load could reuse it unseen).
inline bool reset_peak_rss() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return bool(out);
}

struct outcome {
  std::string error;                // "" when it loaded
  double seconds = 0;               // the load alone
  std::uint64_t peak_growth = 0;    // resident bytes at the peak during the load, above those before it
  std::vector<std::string> opened;  // every path the load opened or read, as the hook saw it
};

// Runs load(engine, hook) on a fresh 1-rank toy engine, the hook recording what it opens and
// reads. A FIFO in `fifos` is opened for writing (which frees a reader blocked on it) once the
// load has run for 10 s.
template <class Load>
outcome watched(Load&& load, const std::vector<std::string>& fifos = {}) {
  outcome out;
  std::mutex mu;
  std::atomic<bool> done{false};
  std::thread loader([&] {
    zshard::run_ranks(1, [&](zshard::thread_comm& comm) {
      toy::ids id;
      zshard::host_backend backend;
      zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, toy::make_spec({}, id),
                                                                    ckpt_test::engine_options());
      const zshard::checkpoint::io_hook hook = [&](const zshard::checkpoint::io_event& e) {
        if (e.call == zshard::checkpoint::io_call::open || e.call == zshard::checkpoint::io_call::read) {
          std::lock_guard lock(mu);
          out.opened.push_back(e.path);
        }
        return 0;
      };
      REQUIRE(reset_peak_rss());
      const std::uint64_t before = rss_bytes();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        load(eng, hook);
      } catch (const zshard::error& e) {
        out.error = e.what();
      }
      out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::uint64_t peak = peak_rss_bytes();
      out.peak_growth = peak > before ? peak - before : 0;
    });
    done = true;
  });
  const auto start = std::chrono::steady_clock::now();
  while (!done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) continue;
    for (const auto& f : fifos)  // a reader blocked in open() on it is let through, and reads nothing
      if (const int fd = ::open(f.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC); fd >= 0) ::close(fd);
  }
  loader.join();
  return out;
}

// checkpoint::load of `path`, watched.
inline outcome load_watched(const std::string& path, const std::vector<std::string>& fifos = {}) {
  return watched(
      [&](auto& eng, const zshard::checkpoint::io_hook& hook) { zshard::checkpoint::load(eng, path, {.hook = hook}); },
      fifos);
}

// Every path the load touched is inside `dir` (under it, and no ".." component).
inline bool stayed_inside(const outcome& o, const std::string& dir) {
  for (const auto& p : o.opened)
    if (p.rfind(dir + "/", 0) != 0 || p.find("/../") != std::string::npos || p.find("//") != std::string::npos)
      return false;
  return true;
}

// The manifest of checkpoint directory `ckpt`, edited by `edit` and sealed again as a save
// seals it (so that only what the edit changed is wrong).
template <class Edit>
void edit_manifest(const std::string& ckpt, Edit&& edit) {
  const std::string path = ckpt + "/manifest.json";
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(zshard::checkpoint::read_small_file(path));
  j.erase(zshard::checkpoint::manifest_checksum_key);
  edit(j);
  zshard::checkpoint::write_small_file(path, zshard::checkpoint::seal_manifest(j.dump(1)));
}

// The same with the manifest's text: `edit` changes the JSON object's text (before its seal).
template <class Edit>
void edit_manifest_text(const std::string& ckpt, Edit&& edit) {
  const std::string path = ckpt + "/manifest.json";
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(zshard::checkpoint::read_small_file(path));
  j.erase(zshard::checkpoint::manifest_checksum_key);
  std::string text = j.dump(1);
  edit(text);
  zshard::checkpoint::write_small_file(path, zshard::checkpoint::seal_manifest(std::move(text)));
}

}  // namespace hostile_load

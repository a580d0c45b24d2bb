// core/host_wait.hpp: a host wait polls, runs its checks between polls and ends on the first
// that throws, on a stop flag or on its deadline; it never blocks where nothing can stop it.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "zshard/core/host_wait.hpp"

using namespace zshard;
using namespace std::chrono_literals;

TEST_CASE("host wait: ready at once runs no check") {
  wait_watch watch;
  int checks = 0;
  watch.add([&] { ++checks; });
  int polls = 0;
  poll_until([&] { return ++polls > 0; }, {1000ms, &watch, nullptr}, "ready");
  CHECK(polls == 1);
  CHECK(checks == 0);
}

TEST_CASE("host wait: a never-ready wait ends with the error a check throws (a fake NCCL error)") {
  wait_watch watch;
  int polls = 0, checks = 0;
  watch.add([&] { ++checks; });  // a healthy communicator: never throws
  const auto failing = watch.add([&] {
    if (polls >= 3) throw error(error_kind::comm, "fake NCCL asynchronous error: ncclRemoteError");
  });
  CHECK(watch.size() == 2);
  const auto start = std::chrono::steady_clock::now();
  try {
    poll_until([&] { return ++polls < 0; }, {0ms, &watch, nullptr}, "stream stuck behind a collective");  // no deadline
    FAIL("the wait returned");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::comm);
    CHECK(std::string(e.what()).find("ncclRemoteError") != std::string::npos);
  }
  CHECK(polls == 3);
  CHECK(checks == 3);  // every check ran between polls, in order
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  watch.remove(failing);
  CHECK(watch.size() == 1);
  watch.remove(failing);  // removing twice is harmless
  CHECK(watch.size() == 1);
}

TEST_CASE("host wait: a stop flag set by another thread ends the wait at once") {
  std::atomic<bool> stop{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    stop.store(true);
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    poll_until([] { return false; }, {0ms, nullptr, &stop}, "helper waiting for a copy");
    FAIL("the wait returned");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::comm);
    CHECK(std::string(e.what()).find("helper waiting for a copy: abandoned") != std::string::npos);
  }
  setter.join();
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("host wait: the deadline throws the timeout error, not before it") {
  const auto start = std::chrono::steady_clock::now();
  try {
    poll_until([] { return false; }, {30ms, nullptr, nullptr}, "synchronize");
    FAIL("the wait returned");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::backend);
    CHECK(std::string(e.what()).find("synchronize did not finish within 30 ms") != std::string::npos);
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= 30ms);
  CHECK(waited < 5s);
  // A caller's own timeout error.
  CHECK_THROWS_AS(
      poll_until([] { return false; }, {1ms, nullptr, nullptr}, "x", [] { return std::runtime_error("own"); }),
      std::runtime_error);
}

TEST_CASE("host wait: work that finishes later is waited for, checks and all") {
  std::atomic<bool> done{false};
  wait_watch watch;
  std::atomic<int> checks{0};
  watch.add([&] { ++checks; });
  std::thread worker([&] {
    std::this_thread::sleep_for(10ms);
    done.store(true);
  });
  poll_until([&] { return done.load(); }, {10'000ms, &watch, nullptr}, "worker");
  worker.join();
  CHECK(done.load());
  CHECK(checks.load() > 0);
}

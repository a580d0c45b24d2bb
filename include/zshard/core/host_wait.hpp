#pragma once
// How the host waits for asynchronous work without ever blocking where nobody can stop it.
//
// A host wait on a GPU (a stream, an event, a device-to-host copy) can last forever when the
// work ahead of it is a collective waiting for a rank that failed. Blocking driver calls
// (cudaStreamSynchronize, a copy into pageable memory) cannot be interrupted, so every host
// wait in zshard polls instead: it asks whether the work is done, and between polls runs the
// checks that can end it early — a communicator's asynchronous error (NCCL), a peer's
// cancellation, a deadline. A check ends the wait by throwing.
//
// wait_watch holds the checks that every wait of one backend runs: the engine registers its
// communicators' health checks there (engine.hpp), so cuda_backend::synchronize stops on an
// NCCL error or a cancelled peer instead of waiting out its timeout. Only the thread that
// owns the backend waits through its watch; helper threads poll with poll_until and a stop
// flag of their own (offload/host_adam.hpp).
//
// No CUDA here: CPU tests drive poll_until with an injected "never ready" wait and fake errors.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zshard/core/error.hpp"

namespace zshard {

// Checks run between polls of a host wait; a check throws to end the wait (and that error is
// what the waiter reports). Registered checks must outlive their registration (remove()).
class wait_watch {
 public:
  using check = std::function<void()>;

  // Returns a handle for remove().
  std::size_t add(check c) {
    checks_.push_back({++serial_, std::move(c)});
    return serial_;
  }
  void remove(std::size_t handle) noexcept {
    for (auto it = checks_.begin(); it != checks_.end(); ++it)
      if (it->handle == handle) {
        checks_.erase(it);
        return;
      }
  }
  std::size_t size() const noexcept { return checks_.size(); }
  // Runs every check; the first that throws ends the wait.
  void run() const {
    for (const auto& c : checks_) c.fn();
  }

 private:
  struct entry {
    std::size_t handle;
    check fn;
  };
  std::vector<entry> checks_;
  std::size_t serial_ = 0;
};

// What bounds one wait. timeout <= 0: no deadline (the watch and the stop flag still apply).
struct wait_limits {
  std::chrono::milliseconds timeout{0};
  const wait_watch* watch = nullptr;
  const std::atomic<bool>* stop = nullptr;  // set by another thread: give up at once
};

namespace detail {
// Busy-poll for the first rounds (most waits are microseconds), then give the core back.
inline void wait_back_off(int spins) {
  if (spins < 2000)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}
}  // namespace detail

// Polls ready() until it returns true. Between polls: the watch's checks (which may throw),
// the stop flag (throws error_kind::comm: a peer gave up), the deadline (throws the error
// on_timeout() returns). `what` names the wait in those errors.
template <class Ready, class OnTimeout>
void poll_until(Ready&& ready, const wait_limits& limits, const std::string& what, OnTimeout&& on_timeout) {
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    if (ready()) return;
    if (limits.watch) limits.watch->run();
    if (limits.stop && limits.stop->load(std::memory_order_relaxed))
      throw error(error_kind::comm, what + ": abandoned because a peer rank or the owner gave up",
                  "the first failure is the root cause: fix that one");
    if (limits.timeout.count() > 0 && std::chrono::steady_clock::now() - start > limits.timeout) throw on_timeout();
    detail::wait_back_off(spins);
  }
}

// With the usual timeout error: "<what> did not finish within N ms".
template <class Ready>
void poll_until(Ready&& ready, const wait_limits& limits, const std::string& what) {
  poll_until(std::forward<Ready>(ready), limits, what, [&] {
    return error(error_kind::backend, what + " did not finish within " + std::to_string(limits.timeout.count()) + " ms",
                 "the work ahead of it may be a collective waiting for a rank that failed or skipped it; raise the "
                 "timeout only if the queued work is legitimately that long");
  });
}

}  // namespace zshard

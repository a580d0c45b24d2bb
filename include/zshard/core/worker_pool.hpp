#pragma once
// A small persistent thread pool for bandwidth-bound host loops (the offloaded optimizer, its
// gradient accumulation). Threads are created once; a job is `count` independent work items
// that the threads claim one at a time from a shared counter, so uneven items balance
// themselves. Posting a job allocates nothing: the body is passed by reference and called
// through one function pointer.
//
// Two ways to run a job:
//   run(count, body)    every thread works on it, the caller included; returns when done
//   start(count, body)  only the helper threads work on it and the caller goes on (overlap);
//                       wait() joins. The body must outlive the job. With no helpers (a pool
//                       of one thread) start() runs the job before returning.
// One job at a time: run() and start() first wait for a started job. Bodies must not throw
// (an exception on a helper thread would terminate the program). The pool belongs to one
// owner thread; only that thread calls run/start/wait.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "zshard/core/error.hpp"

namespace zshard {

class worker_pool {
 public:
  // `threads` counts the caller: 1 means no helper threads; 0 means one per hardware thread.
  explicit worker_pool(int threads = 0) {
    ZSHARD_REQUIRE(threads >= 0, error_kind::config,
                   "worker_pool: thread count " + std::to_string(threads) + " is negative",
                   "use 0 for one thread per hardware thread, or a positive count");
    if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    size_ = threads;
    helpers_.reserve(static_cast<std::size_t>(threads - 1));
    try {
      for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { helper_loop(); });
    } catch (...) {  // joins the helpers already started, or their destructors would terminate
      stop_helpers();
      throw;
    }
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;
  ~worker_pool() {
    wait();
    stop_helpers();
  }

  // Threads working on a run() job, the caller included.
  int size() const noexcept { return size_; }

  template <class F>
  void run(std::size_t count, F&& body) {
    wait();
    if (count == 0) return;
    if (helpers_.empty() || count == 1) {  // waking helpers costs more than one item
      for (std::size_t i = 0; i < count; ++i) body(i);
      return;
    }
    post(count, body);
    drain();
    wait();
  }

  template <class F>
  void start(std::size_t count, F& body) {
    wait();
    if (count == 0) return;
    if (helpers_.empty()) {
      for (std::size_t i = 0; i < count; ++i) body(i);
      return;
    }
    post(count, body);
  }

  // Whether no started job is still running (never blocks): a caller with queued work can
  // start the next job when this says so, and otherwise go on.
  bool idle() {
    if (!in_flight_) return true;
    std::lock_guard lock(mu_);
    if (active_ != 0) return false;
    in_flight_ = false;
    return true;
  }

  // Returns once the current job (if any) has finished on every helper.
  void wait() {
    if (!in_flight_) return;
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return active_ == 0; });
    in_flight_ = false;
  }

 private:
  void stop_helpers() noexcept {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  template <class F>
  void post(std::size_t count, F& body) {
    {
      std::lock_guard lock(mu_);
      call_ = [](void* ctx, std::size_t i) { (*static_cast<std::remove_reference_t<F>*>(ctx))(i); };
      ctx_ = const_cast<void*>(static_cast<const void*>(&body));
      count_ = count;
      next_.store(0, std::memory_order_relaxed);
      active_ = static_cast<int>(helpers_.size());
      ++generation_;
      in_flight_ = true;
    }
    wake_.notify_all();
  }

  // Claims and runs items until none are left. call_, ctx_ and count_ were written under the
  // mutex before the job was posted and stay unchanged until every helper has reported done.
  void drain() noexcept {
    for (;;) {
      const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= count_) return;
      call_(ctx_, i);
    }
  }

  void helper_loop() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      bool last = false;
      {
        std::lock_guard lock(mu_);
        last = --active_ == 0;
      }
      if (last) done_.notify_all();
    }
  }

  int size_ = 1;
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  bool in_flight_ = false;  // owner thread only
  void (*call_)(void*, std::size_t) = nullptr;
  void* ctx_ = nullptr;
  std::size_t count_ = 0;
  std::atomic<std::size_t> next_{0};
};

}  // namespace zshard

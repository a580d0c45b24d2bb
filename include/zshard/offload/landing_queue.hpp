#pragma once
// Copies to the host still in flight, and the helper jobs that consume them once they land:
// host_adam's device path (offload/host_adam.hpp). The rank thread enqueues a copy on a stream,
// records an event after it and pushes a chunk here; it never waits for the stream. The pool's
// helper threads take the chunks in order, one job at a time: each job polls the chunk's event
// (never blocking, and giving up when told to stop), then runs the owner's work on it tile by
// tile. The rank thread waits only when the queue or the two staging halves are full, and at
// drain(); it waits by polling through the backend (wait_host: the watch's health checks and
// the timeout), which a helper thread cannot run.
//
// A backend without event waits (ready/wait_host) gets the old schedule: the rank thread
// waits for the copy's stream before queueing it.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "zshard/core/host_wait.hpp"
#include "zshard/core/worker_pool.hpp"

namespace zshard::offload {

// Owner provides `void accumulate_chunk_tile(const landing_chunk& c, std::size_t k) noexcept`.
struct landing_chunk {
  std::size_t first_tile = 0, tile_count = 0;
  std::size_t base_local = 0;  // local offset the chunk starts at
  const float* src = nullptr;  // where the copy lands (a staging half, or the destination itself)
  bool first = false;          // the first gradient of its parameter since the last update
  int half = -1;               // the staging half it holds until consumed (-1: none)
  std::size_t event = 0;       // the ring slot of the event after its copy
};

template <class Backend, class Owner>
class landing_queue {
 public:
  static constexpr bool waits_by_event = requires(Backend& b, const typename Backend::event& e) {
    { b.ready(e) } -> std::convertible_to<bool>;
    b.wait_host(e);
  };
  // Chunks in flight at most (and events in the ring): past that the rank thread waits.
  static constexpr std::size_t slots = 64;

  landing_queue(Owner& owner, Backend& backend, worker_pool& pool) : owner_(owner), backend_(backend), pool_(pool) {}
  landing_queue(const landing_queue&) = delete;
  landing_queue& operator=(const landing_queue&) = delete;

  // Makes the queue usable (the events); a queue never started holds nothing.
  void start() {
    queue_.reserve(slots);
    if constexpr (waits_by_event)
      for (std::size_t i = 0; i < slots; ++i) events_.push_back(backend_.make_event());
  }
  // Helpers still waiting for a copy that will never land (a failed collective ahead of it)
  // give up at once. The owner calls it before its pool is joined.
  void stop() noexcept { abandon_.store(true); }

  std::size_t size() const noexcept { return queue_.size() - queue_head_; }

  // Room for one more chunk, waiting for the oldest ones if the queue is full.
  void make_room() {
    while (size() >= slots) finish_oldest();
  }
  // A staging half no queued chunk holds (0 or 1, alternating), waiting for the oldest chunks
  // until one is free. The caller fills it and pushes a chunk that names it.
  int free_half() {
    make_room();
    for (;;) {
      for (int h : {next_half_, 1 - next_half_})
        if (!half_busy_[h]) {
          next_half_ = 1 - h;
          return h;
        }
      finish_oldest();
    }
  }

  // Queues c, whose copy was just enqueued on `on` (room was made first), and starts work.
  template <class Stream>
  void push(landing_chunk c, Stream& on) {
    if constexpr (waits_by_event) {
      c.event = next_event_++ % slots;
      backend_.record(events_[c.event], on);
    } else {
      backend_.synchronize(on);  // a backend that cannot wait by event: the copy lands now
    }
    if (c.half >= 0) half_busy_[c.half] = true;
    queue_.push_back(c);
    pump();
  }

  // Starts the oldest chunk's job when the helpers are free; never blocks. Without helpers a
  // started job would run (and wait) on this thread, so it waits for drain().
  void pump() {
    if (running_ != none) {
      if (!pool_.idle()) return;
      complete_head();
    }
    if (queue_head_ == queue_.size() || pool_.size() == 1) return;
    job_ = {this, queue_[queue_head_]};
    running_ = queue_head_;
    pool_.start(job_.c.tile_count, job_);
  }

  // Every queued chunk consumed.
  void drain() {
    while (queue_head_ != queue_.size()) finish_oldest();
  }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  struct job {
    landing_queue* q = nullptr;
    landing_chunk c{};
    void operator()(std::size_t k) const noexcept {
      if (q->landed(c)) q->owner_.accumulate_chunk_tile(c, k);
    }
  };

  // Called by helper threads: polls until c's copy has landed. False when the wait was
  // abandoned or failed; the error is kept for the rank thread.
  bool landed(const landing_chunk& c) noexcept {
    if constexpr (waits_by_event) {
      try {
        const auto& e = events_[c.event];
        poll_until([&] { return backend_.ready(e); }, wait_limits{std::chrono::milliseconds(0), nullptr, &abandon_},
                   "host_adam: a gradient copy to the host");
      } catch (...) {
        std::lock_guard lock(error_mu_);
        if (!error_) error_ = std::current_exception();
        return false;
      }
    }
    (void)c;
    return true;
  }

  // Consumes the oldest chunk, waiting for its copy on this thread first.
  void finish_oldest() {
    const landing_chunk c = queue_[queue_head_];
    try {
      if constexpr (waits_by_event) backend_.wait_host(events_[c.event]);
    } catch (...) {
      abandon();
      throw;
    }
    if (running_ == none) {
      job_ = {this, c};
      running_ = queue_head_;
      pool_.run(c.tile_count, job_);  // every thread, this one included: the copy has landed
    }
    pool_.wait();
    complete_head();
  }

  // The running job (the queue's head) has finished: release its half, or report its failure.
  void complete_head() {
    running_ = none;
    std::exception_ptr failed;
    {
      std::lock_guard lock(error_mu_);
      failed = std::exchange(error_, nullptr);
    }
    if (failed) {
      abandon();
      std::rethrow_exception(failed);
    }
    const landing_chunk& c = queue_[queue_head_];
    if (c.half >= 0) half_busy_[c.half] = false;
    if (++queue_head_ == queue_.size()) {
      queue_.clear();
      queue_head_ = 0;
    }
  }

  // After a failure: helpers stop waiting, the queue is dropped (the step fails anyway).
  void abandon() noexcept {
    abandon_.store(true);
    pool_.wait();
    abandon_.store(false);
    queue_.clear();
    queue_head_ = 0;
    running_ = none;
    half_busy_[0] = half_busy_[1] = false;
    std::lock_guard lock(error_mu_);
    error_ = nullptr;
  }

  Owner& owner_;
  Backend& backend_;
  worker_pool& pool_;
  // The rank thread's, except abandon_ and error_, which helpers read and write.
  std::vector<landing_chunk> queue_;  // FIFO: [queue_head_, size)
  std::size_t queue_head_ = 0;
  std::size_t running_ = none;                   // index in queue_ of the chunk the pool works on
  std::vector<typename Backend::event> events_;  // a ring of `slots`: chunk i's copy landed
  std::size_t next_event_ = 0;
  bool half_busy_[2] = {false, false};
  int next_half_ = 0;
  std::atomic<bool> abandon_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
  job job_{};
};

}  // namespace zshard::offload

#pragma once
// The NVMe tier's I/O threads: whole-chunk reads and writes (offload/nvme_file.hpp) queued by
// the rank thread and run by a few threads of their own, so that the disk works while the
// worker pool runs AdamW. One request per chunk buffer: submit() queues it, wait() returns when
// it is done and rethrows its failure (the file, the offset and the byte count). A write may
// name a read into the same buffer to follow it (then_read): the I/O thread issues it at once,
// so the disk does not wait for the rank thread to be scheduled between the two.
//
// Why threads and blocking pread/pwrite, not io_uring: on the drives measured (bench/NOTES.md,
// "offload_tiers") whole chunks of megabytes reach the drive's sequential bandwidth from two
// threads, the kernel splitting each into requests the device runs in parallel; a submission
// queue adds nothing there and a build dependency (liburing) everywhere.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "zshard/offload/nvme_file.hpp"

namespace zshard::offload {

struct nvme_request {
  const nvme_file* file = nullptr;
  bool write = false;
  void* buf = nullptr;
  std::size_t bytes = 0;
  std::uint64_t offset = 0;
  bool then_read = false;  // after a successful write: read `then_offset` into buf
  std::uint64_t then_offset = 0;

 private:
  friend class nvme_io;
  bool done = true;  // nothing in flight
  std::exception_ptr failed;
};

class nvme_io {
 public:
  explicit nvme_io(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { serve(); });
  }
  nvme_io(const nvme_io&) = delete;
  nvme_io& operator=(const nvme_io&) = delete;
  // Requests still queued are dropped; running ones finish first (their buffers outlive this).
  ~nvme_io() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      queue_.clear();
    }
    work_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void submit(nvme_request& r) {
    {
      std::lock_guard lock(mu_);
      r.done = false;
      r.failed = nullptr;
      queue_.push_back(&r);
    }
    work_.notify_one();
  }

  // Until r is done; rethrows its failure. A request never submitted is done.
  void wait(nvme_request& r) {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return r.done; });
    if (r.failed) std::rethrow_exception(std::exchange(r.failed, nullptr));
  }
  // As wait(), but swallows the failure (draining after an error that is thrown already).
  void settle(nvme_request& r) noexcept {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return r.done; });
    r.failed = nullptr;
  }

 private:
  void serve() {
    for (;;) {
      nvme_request* r = nullptr;
      {
        std::unique_lock lock(mu_);
        work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        r = queue_.front();
        queue_.pop_front();
      }
      std::exception_ptr failed;
      try {
        if (r->write)
          r->file->write(r->buf, r->bytes, r->offset);
        else
          r->file->read(r->buf, r->bytes, r->offset);
        if (r->write && r->then_read) r->file->read(r->buf, r->bytes, r->then_offset);
      } catch (...) {
        failed = std::current_exception();
      }
      {
        std::lock_guard lock(mu_);
        r->failed = std::move(failed);  // the rank thread holds the only reference once it takes it
        r->done = true;
      }
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_, done_;
  std::deque<nvme_request*> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace zshard::offload

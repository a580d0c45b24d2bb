#pragma once
// The NVMe tier of the host Offloader's optimizer state (offload_config::optimizer_state =
// nvme): its flat f32 arrays of master, m and v (host_adam.hpp's layout) in one file per rank,
// in fixed chunks of C = nvme_chunk_numel elements stored as [master | m | v] (12·C bytes).
//
// Two slots. The file holds every chunk twice, side by side (chunk k of slot s at byte
// (2k + s) · 12·C, so that a step's reads and writes stay close); the state is the active slot's. A step
// (update) reads each chunk from the active slot into one of nvme_buffer_count chunk buffers,
// hands it to the caller (AdamW over the chunk's tiles) and writes it to the other slot, the
// buffer's next read (chunk k + buffers) queued behind that write: chunk k is updated while
// k + 1 .. are read and k - 1 written (nvme_io.hpp's threads). Only when
// every write has completed does the other slot become the active one. So a failed read or
// write (the error names the file, the offset and the bytes) leaves the active slot, the
// state of the last completed step, as it was; before the error propagates, the caller's
// `restore` runs on each chunk already handed out, read again from the active slot, so that
// what it derived from the new values (the working parameters) goes back too.
//
// Between steps (checkpoints, initial values, state access) read() and write() move element
// ranges of one field through the first chunk buffer, kept as a one-chunk cache and written
// back (to the active slot) before the next step or a different chunk.
//
// Memory: the chunk buffers, in the host Offloader's resource (its ledger, optimizer_state);
// the files, in the ledger nvme_ledger() (optimizer_state: both slots). A backend without
// storage (phantom) charges both and touches nothing.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zshard/core/buffer.hpp"
#include "zshard/offload/nvme_file.hpp"
#include "zshard/offload/nvme_io.hpp"
#include "zshard/offload/offload_config.hpp"

namespace zshard::offload {

// Where a field's elements sit in a chunk buffer: master at 0, m at C, v at 2·C.
struct chunk_view {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  std::size_t first = 0;  // flat index of the chunk's element 0: master[i - first] is element i
};

// Chunk buffers for `chunks` chunks: nvme_buffer_count, but no more than there are chunks to
// fill them. The planner charges the same.
inline std::size_t nvme_buffers(const offload_config& oc, std::size_t chunks) noexcept {
  return std::min(std::size_t(oc.nvme_buffer_count), chunks);
}

template <class Resource>
class nvme_state {
 public:
  // total_numel: the flat arrays' length, rounded up here to whole chunks. `tag`: unique per rank
  // of a process (file name).
  nvme_state(const offload_config& oc, const std::string& tag, std::size_t total_numel, Resource& memory,
             bool holds_storage)
      : chunk_(oc.nvme_chunk_numel), chunks_((total_numel + chunk_ - 1) / chunk_), ledger_("nvme (files)") {
    const std::uint64_t file_bytes = 2 * std::uint64_t(chunks_) * chunk_bytes();
    ledger_.charge(mem_category::optimizer_state, file_bytes);
    const std::size_t buffers = nvme_buffers(oc, chunks_);
    for (std::size_t b = 0; b < buffers; ++b)
      buffers_.emplace_back(memory, dtype::f32, 3 * chunk_, mem_category::optimizer_state);
    requests_.resize(buffers_.size());
    if (holds_storage && chunks_ > 0) {
      file_.emplace(oc.nvme_path, "zshard-optimizer-" + tag, file_bytes);
      io_.emplace(oc.nvme_io_threads);
    }
  }
  nvme_state(const nvme_state&) = delete;
  nvme_state& operator=(const nvme_state&) = delete;
  ~nvme_state() {
    if (io_)
      for (auto& r : requests_) io_->settle(r);
  }

  std::size_t chunk_numel() const noexcept { return chunk_; }
  std::size_t chunks() const noexcept { return chunks_; }
  std::size_t chunk_bytes() const noexcept { return 3 * chunk_ * sizeof(float); }
  const memory_ledger& ledger() const noexcept { return ledger_; }
  const nvme_file* file() const noexcept { return file_ ? &*file_ : nullptr; }
  int active_slot() const noexcept { return active_; }
  // Bytes read from and written to the file by steps (not by state access).
  std::uint64_t step_bytes_read() const noexcept { return step_read_; }
  std::uint64_t step_bytes_written() const noexcept { return step_written_; }

  // One step: update(k, view) for every chunk in order (on the rank thread; it may use a pool),
  // then the other slot becomes active. On a failure, restore(k, view) for each chunk already
  // updated, with its state as of the active slot, then the failure propagates.
  template <class Update, class Restore>
  void update(Update&& update_chunk, Restore&& restore_chunk) {
    if (!file_) {  // accounting only: what a step would move
      step_read_ += std::uint64_t(chunks_) * chunk_bytes();
      step_written_ += std::uint64_t(chunks_) * chunk_bytes();
      return;
    }
    flush();
    cached_ = none;
    const std::size_t B = buffers_.size(), K = chunks_;
    const int from = active_, to = 1 - active_;
    std::size_t entered = 0;  // chunks handed to update_chunk (the last may have failed half-way)
    try {
      for (std::size_t k = 0; k < B; ++k) start(k, false, from, k, K);
      for (std::size_t k = 0; k < K; ++k) {
        io_->wait(requests_[k % B]);  // chunk k read (behind chunk k - B's write)
        ++entered;
        update_chunk(k, view(k % B, k));
        start(k % B, true, to, k, k + B);  // written, then chunk k + B read into the buffer
      }
      for (auto& r : requests_) io_->wait(r);
    } catch (...) {
      for (auto& r : requests_) io_->settle(r);
      roll_back(entered, restore_chunk);
      throw;
    }
    active_ = to;
    step_read_ += std::uint64_t(K) * chunk_bytes();
    step_written_ += std::uint64_t(K) * chunk_bytes();
  }

  // Elements [flat, flat + n) of field f (0 master, 1 m, 2 v) of the active slot, to or from
  // host memory; between steps.
  void read(int f, std::size_t flat, float* dst, std::size_t n) { access(f, flat, dst, n, false); }
  void write(int f, std::size_t flat, const float* src, std::size_t n) {
    access(f, flat, const_cast<float*>(src), n, true);
  }
  // The cached chunk back to the file (before a step; state access leaves it dirty).
  void flush() {
    if (!dirty_) return;
    file_->write(buffers_[0].data(), chunk_bytes(), offset(active_, cached_));
    dirty_ = false;
  }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  std::uint64_t offset(int slot, std::size_t k) const noexcept {
    return (2 * std::uint64_t(k) + std::uint64_t(slot)) * chunk_bytes();
  }
  chunk_view view(std::size_t b, std::size_t k) const noexcept {
    float* base = buffers_[b].template as<float>();
    return {base, base + chunk_, base + 2 * chunk_, k * chunk_};
  }
  // Buffer b: read chunk k (write false), or write chunk k and then read chunk `next` from the
  // other slot when there is one.
  void start(std::size_t b, bool write, int slot, std::size_t k, std::size_t next) {
    nvme_request& r = requests_[b];
    r.file = &*file_;
    r.write = write;
    r.buf = buffers_[b].data();
    r.bytes = chunk_bytes();
    r.offset = offset(slot, k);
    r.then_read = write && next < chunks_;
    r.then_offset = r.then_read ? offset(1 - slot, next) : 0;
    io_->submit(r);
  }

  // The chunks handed out so far, from the active slot again (one buffer at a time).
  template <class Restore>
  void roll_back(std::size_t updated, Restore& restore_chunk) {
    try {
      for (std::size_t k = 0; k < updated; ++k) {
        file_->read(buffers_[0].data(), chunk_bytes(), offset(active_, k));
        restore_chunk(k, view(0, k));
      }
    } catch (const error& e) {
      throw error(error_kind::io,
                  "the working parameters of chunks [0, " + std::to_string(updated) +
                      ") could not be restored after a failed step: " + e.message(),
                  "the optimizer state on disk is the last completed step's; load a checkpoint");
    }
  }

  void access(int f, std::size_t flat, float* host, std::size_t n, bool writing) {
    if (!file_) return;
    while (n > 0) {
      const std::size_t k = flat / chunk_, at = flat % chunk_, take = std::min(n, chunk_ - at);
      if (cached_ != k) {
        flush();
        cached_ = none;
        file_->read(buffers_[0].data(), chunk_bytes(), offset(active_, k));
        cached_ = k;
      }
      float* field = buffers_[0].template as<float>() + std::size_t(f) * chunk_ + at;
      if (writing) {
        std::memcpy(field, host, take * sizeof(float));
        dirty_ = true;
      } else {
        std::memcpy(host, field, take * sizeof(float));
      }
      host += take;
      flat += take;
      n -= take;
    }
  }

  const std::size_t chunk_, chunks_;
  memory_ledger ledger_;
  std::vector<buffer<Resource>> buffers_;
  std::vector<nvme_request> requests_;  // one per buffer
  std::optional<nvme_file> file_;       // none without storage
  std::optional<nvme_io> io_;           // after file_: its threads stop before the file goes
  int active_ = 0;
  std::size_t cached_ = none;  // the chunk buffer 0 holds between steps
  bool dirty_ = false;
  std::uint64_t step_read_ = 0, step_written_ = 0;
};

}  // namespace zshard::offload

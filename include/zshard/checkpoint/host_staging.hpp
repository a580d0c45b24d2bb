#pragma once
// The one chunk of host memory a load, save or export moves data through, charged to a ledger
// for its whole life, so that the memory these operations add is bounded by the chunk size
// the caller chooses and shows in the peaks:
//  - the backend's own ledger when its memory is host memory (host backend), category scratch;
//  - its page-locked memory's ledger when it has one (CUDA), which also makes the copies fast;
//  - otherwise a ledger of its own, "host (checkpoint staging)".
#include <cstddef>
#include <memory>
#include <optional>
#include <type_traits>

#include "zshard/core/buffer.hpp"
#include "zshard/offload/host_memory.hpp"

namespace zshard::checkpoint {

template <class Backend>
class host_staging {
  static constexpr bool direct = offload::memory_is_host<Backend>();
  static constexpr bool pinned = !direct && offload::has_pinned_memory<Backend>;
  using resource =
      std::conditional_t<direct, Backend,
                         std::conditional_t<pinned, offload::host_resource_t<Backend>, offload::host_memory>>;

 public:
  host_staging(Backend& backend, std::size_t bytes) {
    static_assert(Backend::holds_storage, "zshard: checkpoints need a backend that holds storage (not phantom)");
    resource* r = nullptr;
    if constexpr (direct) {
      r = &backend;
    } else if constexpr (pinned) {
      r = &backend.pinned();
    } else {
      own_ = std::make_unique<offload::host_memory>("host (checkpoint staging)", std::nullopt, true);
      r = own_.get();
    }
    buf_ = buffer<resource>(*r, dtype::f32, (bytes + 3) / 4, mem_category::scratch);
    ledger_ = &r->ledger();
  }
  void* data() const noexcept { return buf_.data(); }
  char* bytes_at(std::size_t offset) const noexcept { return static_cast<char*>(buf_.data()) + offset; }
  std::size_t bytes() const noexcept { return buf_.bytes(); }
  const memory_ledger& ledger() const noexcept { return *ledger_; }

 private:
  std::unique_ptr<offload::host_memory> own_;  // declared before buf_: outlives it
  buffer<resource> buf_;
  const memory_ledger* ledger_ = nullptr;
};

// The same chunk, allocated at its first use (data() or bytes()) and freed by reset(): for
// operations that may not need it at all.
template <class Backend>
class lazy_host_staging {
 public:
  lazy_host_staging(Backend& backend, std::size_t bytes) : backend_(backend), limit_(bytes), bytes_(bytes) {}
  void* data() { return get().data(); }
  std::size_t bytes() { return get().bytes(); }
  void reset() noexcept { chunk_.reset(); }
  // Sizes the chunk to `needed` bytes (what the largest piece moved through it takes, e.g.
  // chunk_bytes_for) where that is below the limit it was made with, else to the limit: a small
  // model is neither charged nor given the whole limit. Takes effect at the next allocation.
  void fit(std::uint64_t needed) noexcept {
    bytes_ = needed > 0 && needed < limit_ ? static_cast<std::size_t>(needed) : limit_;
  }

 private:
  host_staging<Backend>& get() {
    if (!chunk_) chunk_ = std::make_unique<host_staging<Backend>>(backend_, bytes_);
    return *chunk_;
  }
  Backend& backend_;
  std::size_t limit_;
  std::size_t bytes_;
  std::unique_ptr<host_staging<Backend>> chunk_;
};

}  // namespace zshard::checkpoint

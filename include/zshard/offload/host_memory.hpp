#pragma once
// Where an Offloader keeps state in host memory, and whether it may touch backend memory.
//
// The state lives in a *host memory resource*: something with the allocate / deallocate /
// ledger shape of a backend's memory half, so zshard::buffer works on it.
//  - A backend that owns page-locked host memory exposes it as `pinned()` (cuda_backend):
//    asynchronous device copies need it, and it is what makes them run at full link speed.
//    The state is then charged to that memory's ledger.
//  - Otherwise host_memory below: 64-byte aligned heap memory (whole cache lines, enough for
//    AVX-512 loads) with its own ledger; accounting only when the backend holds no storage
//    (phantom), so a simulated model reports its host memory per rank without having it.
#include <concepts>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "zshard/backend/host_backend.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/memory_ledger.hpp"

namespace zshard::offload {

class host_memory {
 public:
  static constexpr std::size_t alignment = 64;
  // Blocks of a page or more start on a page: what O_DIRECT file I/O into them needs (the NVMe
  // tier's chunk buffers), as page-locked memory does.
  static constexpr std::size_t page = 4096;

  // holds_storage false: charges the ledger and hands out null pointers.
  host_memory(std::string name, std::optional<std::size_t> budget_bytes, bool holds_storage)
      : ledger_(std::move(name), budget_bytes), holds_storage_(holds_storage) {}
  host_memory(const host_memory&) = delete;
  host_memory& operator=(const host_memory&) = delete;

  memory_ledger& ledger() noexcept { return ledger_; }
  const memory_ledger& ledger() const noexcept { return ledger_; }

  void* allocate(std::size_t bytes, mem_category c) {
    if (bytes == 0) return nullptr;
    ledger_.charge(c, bytes);  // throws before anything is allocated
    if (!holds_storage_) return nullptr;
    const std::size_t align = bytes >= page ? page : alignment;
    void* p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (!p) {
      ledger_.release(c, bytes);
      throw error(error_kind::backend,
                  ledger_.name() + ": allocation of " + std::to_string(bytes) + " bytes (" + format_bytes(double(bytes)) +
                      ") for " + std::string(to_string(c)) + " failed",
                  "lower the model size per rank, or add ranks so each holds a smaller shard");
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, mem_category c) noexcept {
    if (bytes == 0) return;
    std::free(p);  // null when accounting only
    ledger_.release(c, bytes);
  }

 private:
  memory_ledger ledger_;
  bool holds_storage_;
};

// A backend that owns page-locked host memory as a resource with its own ledger.
template <class B>
concept has_pinned_memory = requires(B& b, std::size_t bytes, mem_category c, void* p) {
  { b.pinned().allocate(bytes, c) } -> std::same_as<void*>;
  b.pinned().deallocate(p, bytes, c);
  { b.pinned().ledger() } -> std::same_as<memory_ledger&>;
};

// A backend's page-locked memory or pageable host memory, chosen at construction
// (offload_config::pin_memory): the host Offloader's one resource, so that everything it keeps
// is in one ledger whichever it is.
template <class Pinned>
class pinned_or_pageable {
 public:
  pinned_or_pageable(Pinned* pinned, host_memory& pageable) noexcept : pinned_(pinned), pageable_(pageable) {}
  void* allocate(std::size_t bytes, mem_category c) {
    return pinned_ ? pinned_->allocate(bytes, c) : pageable_.allocate(bytes, c);
  }
  void deallocate(void* p, std::size_t bytes, mem_category c) noexcept {
    if (pinned_)
      pinned_->deallocate(p, bytes, c);
    else
      pageable_.deallocate(p, bytes, c);
  }
  memory_ledger& ledger() noexcept { return pinned_ ? pinned_->ledger() : pageable_.ledger(); }
  const memory_ledger& ledger() const noexcept { return pinned_ ? pinned_->ledger() : pageable_.ledger(); }
  bool pinned() const noexcept { return pinned_ != nullptr; }

 private:
  Pinned* pinned_;
  host_memory& pageable_;
};

// The resource an Offloader on Backend keeps host state in.
template <class B>
struct host_resource {
  using type = host_memory;
};
template <has_pinned_memory B>
struct host_resource<B> {
  using type = std::remove_reference_t<decltype(std::declval<B&>().pinned())>;
};
template <class B>
using host_resource_t = typename host_resource<B>::type;

// Whether the backend's buffers are host memory the CPU may read and write directly. A
// backend says so with `static constexpr bool memory_is_host`; without it only host_backend
// is taken to be.
template <class B>
constexpr bool memory_is_host() {
  if constexpr (requires { { B::memory_is_host } -> std::convertible_to<bool>; }) return B::memory_is_host;
  else return std::is_same_v<B, host_backend>;
}

}  // namespace zshard::offload

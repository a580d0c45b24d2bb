#pragma once
// The phantom backend: byte accounting without storage. Every allocation is charged to the
// ledger (with an optional hard budget, as on the host backend) but nothing is allocated, so
// the engine's real logic — gathers, releases, buckets, optimizer state — runs on a model of
// any size in seconds on a laptop, and its per-rank peak can be read and asserted. With
// null_comm (comm/null_comm.hpp) one engine simulates one rank of a virtual world.
//
// Pointers are null placeholders (holds_storage = false): the engine and its policies never
// dereference backend memory when a backend holds none, and every kernel, copy and conversion
// here is a no-op. Gradient statistics are zero, so a step is never skipped as an overflow.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "zshard/backend/backend.hpp"
#include "zshard/optim/adamw.hpp"

namespace zshard {

class phantom_backend {
 public:
  using zshard_tag = backend_tag;
  static constexpr bool holds_storage = false;

  struct stream {};
  struct event {};

  explicit phantom_backend(std::optional<std::size_t> budget_bytes = std::nullopt, std::string name = "phantom")
      : ledger_(std::move(name), budget_bytes) {}

  memory_ledger& ledger() noexcept { return ledger_; }
  const memory_ledger& ledger() const noexcept { return ledger_; }

  // Charges the ledger (throws error_kind::budget over the budget, changing nothing) and
  // returns the placeholder nullptr. Zero bytes are not charged, as on the host backend.
  void* allocate(std::size_t bytes, mem_category c) {
    if (bytes == 0) return nullptr;
    ledger_.charge(c, bytes);
    ++allocations_;
    return nullptr;
  }
  // The pointer is always the placeholder: release by size, which buffer<> always passes.
  void deallocate(void*, std::size_t bytes, mem_category c) noexcept {
    if (bytes == 0) return;
    ledger_.release(c, bytes);  // cannot throw for a size that allocate() charged
  }
  // Allocations made so far (a cost model for allocator pressure; tests read it).
  std::uint64_t allocations() const noexcept { return allocations_; }

  stream make_stream() noexcept { return {}; }
  event make_event() noexcept { return {}; }
  void record(event&, stream&) noexcept {}
  void wait(stream&, const event&) noexcept {}
  void synchronize(stream&) noexcept {}

  void copy(void*, const void*, std::size_t, stream&) noexcept {}
  void fill_zero(void*, std::size_t, stream&) noexcept {}
  void convert(const void*, dtype, void*, dtype, std::size_t, stream&) noexcept {}
  void add_into(float*, const float*, std::size_t, stream&) noexcept {}
  grad_stats grad_stats_of(const float*, std::size_t, stream&) const noexcept { return {0.0, false}; }
  void adamw(const optim::adamw_step&, float*, float*, float*, const float*, std::size_t, void*, dtype,
             stream&) noexcept {}

 private:
  memory_ledger ledger_;
  std::uint64_t allocations_ = 0;
};

static_assert(check_backend<phantom_backend>());

}  // namespace zshard

#pragma once
// The host backend: the reference implementation every engine test runs on. Memory is
// 64-byte aligned heap memory charged to the ledger; streams run work immediately (a valid
// schedule of the stream program), so events are complete as soon as they are recorded.
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "zshard/backend/backend.hpp"
#include "zshard/core/error.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/grad_clip.hpp"

namespace zshard {

class host_backend {
 public:
  using zshard_tag = backend_tag;
  static constexpr bool holds_storage = true;
  static constexpr std::size_t alignment = 64;  // a cache line; enough for AVX-512 loads

  struct stream {};
  struct event {
    bool recorded = false;
  };

  explicit host_backend(std::optional<std::size_t> budget_bytes = std::nullopt, std::string name = "host")
      : ledger_(std::move(name), budget_bytes) {}

  memory_ledger& ledger() noexcept { return ledger_; }
  const memory_ledger& ledger() const noexcept { return ledger_; }

  void* allocate(std::size_t bytes, mem_category c) {
    if (bytes == 0) return nullptr;
    ZSHARD_REQUIRE(bytes <= ~std::size_t{0} - alignment, error_kind::backend,
                   "host allocation of " + std::to_string(bytes) + " bytes is larger than any address space");
    ledger_.charge(c, bytes);  // throws before anything is allocated
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    if (!p) {
      ledger_.release(c, bytes);
      throw error(error_kind::backend, "host allocation of " + std::to_string(bytes) + " bytes for " +
                                           std::string(to_string(c)) + " failed");
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, mem_category c) noexcept {
    if (!p) return;
#ifndef NDEBUG
    poison(p, bytes);  // a view used after its scope reads NaN, not plausible stale weights
#endif
    std::free(p);
    ledger_.release(c, bytes);
  }

  // Fills with 0xFF bytes: NaN as f32, bf16 and f16 alike. Debug builds poison every released
  // buffer with it.
  static void poison(void* p, std::size_t bytes) noexcept { std::memset(p, 0xFF, bytes); }

  stream make_stream() { return {}; }
  event make_event() { return {}; }
  void record(event& e, stream&) noexcept { e.recorded = true; }
  void wait(stream&, const event&) noexcept {}
  void synchronize(stream&) noexcept {}

  void copy(void* dst, const void* src, std::size_t bytes, stream&) noexcept {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, std::size_t bytes, stream&) noexcept {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void convert(const void* src, dtype src_type, void* dst, dtype dst_type, std::size_t n, stream&) noexcept {
    zshard::convert(src, src_type, dst, dst_type, n);
  }

  void add_into(float* dst, const float* src, std::size_t n, stream&) noexcept {
    for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  // Synchronous on every backend: the result is needed on the host for a global decision.
  grad_stats grad_stats_of(const float* g, std::size_t n, stream&) const noexcept {
    optim::norm_accumulator acc;
    acc.add(g, n, 1.0f);
    return {acc.sum_squares, acc.nonfinite};
  }
  void adamw(const optim::adamw_step& step, float* master, float* m, float* v, const float* grad, std::size_t n,
             void* working_out, dtype working_type, stream&) noexcept {
    optim::adamw_update_scalar(step, master, m, v, grad, n, working_out, working_type);
  }

 private:
  memory_ledger ledger_;
};

static_assert(check_backend<host_backend>());

}  // namespace zshard

#pragma once
// The host backend: the reference implementation every engine test runs on. Memory is
// 64-byte aligned heap memory charged to the ledger (logical bytes, as asked) and served by a
// caching allocator (host_block_cache.hpp: size classes, freed blocks kept for reuse, so a
// steady-state step takes no page faults); reserved_bytes() is what it holds from the heap,
// release_cached() hands the cache back. Streams run work immediately (a valid schedule of the
// stream program), so events are complete as soon as they are recorded. AdamW runs on the
// widest vector path of this CPU whose results equal the scalar reference bit for bit.
//
// One backend per rank, used from that rank's thread (its ledger and cache are not shared).
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "zshard/backend/backend.hpp"
#include "zshard/backend/host_block_cache.hpp"
#include "zshard/core/error.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/adamw_dispatch.hpp"
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

  // cache_limit_bytes: most bytes of freed blocks kept for reuse (unset: no limit; 0: every
  // free goes back to the heap, the behaviour before the cache).
  explicit host_backend(std::optional<std::size_t> budget_bytes = std::nullopt, std::string name = "host",
                        std::optional<std::size_t> cache_limit_bytes = std::nullopt)
      : ledger_(std::move(name), budget_bytes), cache_(cache_limit_bytes) {}
  host_backend(const host_backend&) = delete;
  host_backend& operator=(const host_backend&) = delete;

  memory_ledger& ledger() noexcept { return ledger_; }
  const memory_ledger& ledger() const noexcept { return ledger_; }

  void* allocate(std::size_t bytes, mem_category c) {
    if (bytes == 0) return nullptr;
    ZSHARD_REQUIRE(bytes <= ~std::size_t{0} - alignment, error_kind::backend,
                   "host allocation of " + std::to_string(bytes) + " bytes is larger than any address space");
    ledger_.charge(c, bytes);  // throws before anything is allocated
    void* p = cache_.allocate(bytes);
    if (!p) {
      ledger_.release(c, bytes);
      throw error(error_kind::backend,
                  ledger_.name() + ": host allocation of " + std::to_string(bytes) + " bytes (" +
                      format_bytes(double(bytes)) + ") for " + std::string(to_string(c)) + " failed",
                  "lower the model size per rank or the budgets (max_live_numel, reduce_bucket_numel)");
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, mem_category c) noexcept {
    if (!p) return;
#ifndef NDEBUG
    poison(p, bytes);  // a view used after its scope reads NaN, not plausible stale weights
#endif
    cache_.deallocate(p, bytes);
    ledger_.release(c, bytes);
  }

  // Fills with 0xFF bytes: NaN as f32, bf16 and f16 alike. Debug builds poison every released
  // buffer with it (before the cache keeps it, so a reused block starts as NaN too).
  static void poison(void* p, std::size_t bytes) noexcept { std::memset(p, 0xFF, bytes); }

  // Bytes held from the heap (blocks in use at their size class, plus freed blocks kept for
  // reuse): at least the ledger's total, usually a little more.
  std::size_t reserved_bytes() const noexcept { return cache_.reserved_bytes(); }
  std::size_t cached_bytes() const noexcept { return cache_.cached_bytes(); }
  // Returns every cached block to the heap (e.g. after training, before evaluation with a
  // different memory pattern); returns the bytes freed. Blocks in use are untouched.
  std::size_t release_cached() noexcept { return cache_.release(); }
  const host_block_cache& cache() const noexcept { return cache_; }
  host_block_cache& cache() noexcept { return cache_; }

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
    optim::adamw_update_on(adamw_path_, step, master, m, v, grad, n, working_out, working_type, adamw_prefetch_);
  }
  optim::simd_path adamw_path() const noexcept { return adamw_path_; }

 private:
  // The CPU's own bf16 conversion flushes subnormals (adamw_avx512.hpp): the integer-rounding
  // AVX-512 path is as fast here and equals the scalar reference exactly.
  static optim::simd_path exact_path() noexcept {
    const optim::simd_path p = optim::best_path();
    return p == optim::simd_path::avx512_bf16 ? optim::simd_path::avx512 : p;
  }

  memory_ledger ledger_;
  host_block_cache cache_;
  optim::simd_path adamw_path_ = exact_path();
  std::size_t adamw_prefetch_ = optim::adamw_prefetch_bytes();  // read here: a bad setting throws at construction
};

static_assert(check_backend<host_backend>());

}  // namespace zshard

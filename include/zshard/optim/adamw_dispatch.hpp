#pragma once
// The host AdamW: one entry point over the scalar, AVX2 and AVX-512 kernels (chosen at run
// time from the CPU's features, or forced), and a multi-threaded driver that splits a range
// into cache-line-aligned tiles over a persistent worker pool.
//
// Why these choices: fp32 AdamW reads 16 bytes per parameter (p, g, m, v) and writes 12 (p,
// m, v) plus the working copy (2 for bf16), for ~10 flops, so on any current CPU it runs at
// the memory-bandwidth limit once it is vectorised. What is left to win is bytes: the working
// copy is written in the same pass (a separate cast pass would read p again: 34 instead of 30
// bytes per parameter), and tiles are whole cache lines of every array so no two threads
// write the same line.
#include <cstddef>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/worker_pool.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/adamw_avx2.hpp"
#include "zshard/optim/adamw_avx512.hpp"
#include "zshard/optim/adamw_prefetch.hpp"
#include "zshard/optim/cpu_features.hpp"

namespace zshard::optim {

// Tiles start at multiples of this many elements: 64 bytes of a bf16/f16 working copy and 128
// of each f32 array, so with 64-byte aligned arrays every tile owns whole cache lines.
inline constexpr std::size_t tile_granule = 32;

constexpr std::size_t round_up_to_granule(std::size_t n) noexcept {
  return (n + tile_granule - 1) / tile_granule * tile_granule;
}

namespace detail {
template <class W>
void adamw_on(simd_path path, const adamw_step& s, float* master, float* m, float* v, const float* grad, std::size_t n,
              W* out, std::size_t prefetch_bytes) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  switch (path) {
    case simd_path::avx512_bf16:
      if constexpr (std::is_same_v<W, bf16>)
        return avx512::adamw_update_bf16_native(s, master, m, v, grad, n, out, prefetch_bytes);
      [[fallthrough]];
    case simd_path::avx512:
      return avx512::adamw_update(s, master, m, v, grad, n, out, prefetch_bytes);
    case simd_path::avx2:
      return avx2::adamw_update(s, master, m, v, grad, n, out);
    case simd_path::automatic:
    case simd_path::scalar:
      break;
  }
#else
  (void)path;
#endif
  (void)prefetch_bytes;  // the AVX2 and scalar paths have no software prefetch
  adamw_loop<W>(s, master, m, v, grad, n, out);
}

template <class W>
void convert_on(simd_path path, const float* src, W* dst, std::size_t n) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  switch (path) {
    case simd_path::avx512_bf16:
      if constexpr (std::is_same_v<W, bf16>) return avx512::convert_bf16_native(src, dst, n);
      [[fallthrough]];
    case simd_path::avx512:
      return avx512::convert(src, dst, n);
    case simd_path::avx2:
      return avx2::convert(src, dst, n);
    case simd_path::automatic:
    case simd_path::scalar:
      break;
  }
#else
  (void)path;
#endif
  simd::convert_tail(src, dst, n);
}
}  // namespace detail

// adamw_update_scalar's contract on `path`, which must be resolved (resolve()) and supported
// by this CPU: the caller checks once, not per call. prefetch_bytes (adamw_prefetch.hpp)
// changes the speed only, never a result bit; the default reads the process's setting, which
// throws on a malformed ZSHARD_ADAMW_PREFETCH, so long-lived callers read it once up front.
inline void adamw_update_on(simd_path path, const adamw_step& s, float* master, float* m, float* v, const float* grad,
                            std::size_t n, void* working_out, dtype working_type,
                            std::size_t prefetch_bytes = adamw_prefetch_bytes()) noexcept {
  if (working_out == nullptr) return detail::adamw_on<void>(path, s, master, m, v, grad, n, nullptr, prefetch_bytes);
  switch (working_type) {
    case dtype::f32:
      return detail::adamw_on(path, s, master, m, v, grad, n, static_cast<float*>(working_out), prefetch_bytes);
    case dtype::bf16:
      return detail::adamw_on(path, s, master, m, v, grad, n, static_cast<bf16*>(working_out), prefetch_bytes);
    case dtype::f16:
      return detail::adamw_on(path, s, master, m, v, grad, n, static_cast<f16*>(working_out), prefetch_bytes);
  }
}

// f32 -> working_type over n elements on `path`, rounding as the fused kernels do.
inline void convert_on(simd_path path, const float* src, void* dst, dtype dst_type, std::size_t n) noexcept {
  switch (dst_type) {
    case dtype::f32:
      return detail::convert_on(path, src, static_cast<float*>(dst), n);
    case dtype::bf16:
      return detail::convert_on(path, src, static_cast<bf16*>(dst), n);
    case dtype::f16:
      return detail::convert_on(path, src, static_cast<f16*>(dst), n);
  }
}

// The multi-threaded host AdamW over contiguous ranges. Construction starts the threads; an
// update allocates nothing. Work items are tiles of tile_numel elements (a multiple of
// tile_granule) claimed dynamically, so a thread slowed by the OS does not hold the others.
class host_adamw {
 public:
  static constexpr std::size_t default_tile_numel = std::size_t{1} << 16;  // 256 KiB of each f32 array

  explicit host_adamw(int threads = 0, simd_path path = simd_path::automatic,
                      std::size_t tile_numel = default_tile_numel, std::size_t prefetch_bytes = adamw_prefetch_bytes())
      : path_(resolve(path)),
        tile_(checked_tile(tile_numel)),
        prefetch_(checked_prefetch(prefetch_bytes)),
        pool_(threads) {}

  // adamw_update_scalar's contract, over every thread of the pool.
  void update(const adamw_step& s, float* master, float* m, float* v, const float* grad, std::size_t n,
              void* working_out, dtype working_type) {
    const std::size_t w = size_of(working_type);
    auto body = [&](std::size_t t) {
      const std::size_t b = t * tile_, len = b + tile_ <= n ? tile_ : n - b;
      void* out = working_out ? static_cast<char*>(working_out) + b * w : nullptr;
      adamw_update_on(path_, s, master + b, m + b, v + b, grad + b, len, out, working_type, prefetch_);
    };
    pool_.run(tiles(n), body);
  }

  // The cast pass of an unfused update (benchmarks compare it with the fused write-back).
  void convert(const float* src, void* dst, dtype dst_type, std::size_t n) {
    const std::size_t w = size_of(dst_type);
    auto body = [&](std::size_t t) {
      const std::size_t b = t * tile_, len = b + tile_ <= n ? tile_ : n - b;
      convert_on(path_, src + b, static_cast<char*>(dst) + b * w, dst_type, len);
    };
    pool_.run(tiles(n), body);
  }

  simd_path path() const noexcept { return path_; }
  int threads() const noexcept { return pool_.size(); }
  std::size_t tile_numel() const noexcept { return tile_; }
  std::size_t prefetch_bytes() const noexcept { return prefetch_; }
  worker_pool& pool() noexcept { return pool_; }

 private:
  static std::size_t checked_tile(std::size_t n) {
    ZSHARD_REQUIRE(n > 0, error_kind::config, "host AdamW tile size must be positive",
                   "use a tile of a few ten thousand elements, e.g. 65536");
    return round_up_to_granule(n);
  }
  static std::size_t checked_prefetch(std::size_t bytes) {
    ZSHARD_REQUIRE(bytes <= max_prefetch_bytes, error_kind::config,
                   "host AdamW prefetch distance " + std::to_string(bytes) + " bytes is over the " +
                       std::to_string(max_prefetch_bytes) + "-byte limit",
                   "use 0 (no software prefetch) or a distance of a few KiB, e.g. 2048");
    return bytes;
  }
  std::size_t tiles(std::size_t n) const noexcept { return (n + tile_ - 1) / tile_; }

  simd_path path_;
  std::size_t tile_;
  std::size_t prefetch_;
  worker_pool pool_;
};

}  // namespace zshard::optim

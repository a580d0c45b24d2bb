#pragma once
// How far ahead the AVX-512 AdamW kernel prefetches its four input streams (g, m, v, master),
// in bytes, 0 = no software prefetch: chosen once per process, from ZSHARD_ADAMW_PREFETCH when
// it is set, else from the CPU's vendor. The prefetch changes when a cache line arrives, never
// a value: every setting gives bitwise the same results (tests/offload/test_adamw_kernels.cpp).
//
// Why by vendor (bench/host_adam runs the kernel with the prefetch off, with 2 KiB and with
// this setting side by side; figures with CPU models in bench/NOTES_issue27.md):
//  - Intel Xeon (2-core KVM guest with AVX-512 BF16 and AMX, 2026-12-05): 2 KiB ahead takes the
//    memory-bound kernel (8M and 128M parameters, 1 and 2 threads) from 0.86-0.90 to 0.96-1.06
//    of the same-bytes ceiling; in cache (512K parameters) it makes no difference, and 512 B
//    to 8 KiB measured no better than 2 KiB.
//  - AMD EPYC (2-core KVM guest, issue 27): the same 2 KiB costs 14-25 % memory-bound, and
//    without it the kernel runs at 0.96-1.01 of the ceiling and 0.95-1.03 of DeepSpeed's
//    (presumably its hardware prefetchers keep the streams busy unaided, and the software
//    prefetches only take load slots). Measured here on a Zen 4 EPYC (2-core KVM guest,
//    2026-12-05, 8M and 128M parameters, 1 and 2 threads): 0.97-1.04 of the ceiling without,
//    0.69-0.91 with 2 KiB.
//  - Other or unknown CPUs: off (what the hardware prefetcher does unaided is the safe guess).
// Why not a run-time calibration: the case that matters is memory-bound, which needs a buffer
// several times the last-level cache (hundreds of MB on current servers: tens of ms just to
// allocate and touch), and on a shared machine two runs of a few ms differ by more than the
// effect. A machine that disagrees with its vendor's default sets the variable; one run of
// host_adam shows which way to set it.
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>

#include "zshard/core/error.hpp"
#include "zshard/core/read_number.hpp"

namespace zshard::optim {

// The largest distance accepted: beyond a few KiB the lines are evicted before they are used.
inline constexpr std::size_t max_prefetch_bytes = std::size_t{1} << 16;
// What the kernel did before the distance became a setting (bench/host_adam's comparison).
inline constexpr std::size_t intel_tuned_prefetch_bytes = 2048;

// The distance for this CPU when the variable is unset (see above).
inline std::size_t default_prefetch_bytes() noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) return intel_tuned_prefetch_bytes;
#endif
  return 0;
}

// The distance that `text` (ZSHARD_ADAMW_PREFETCH's value; null or empty = unset) asks for.
inline std::size_t parse_prefetch_bytes(const char* text) {
  if (text == nullptr || *text == '\0') return default_prefetch_bytes();
  const std::optional<std::size_t> bytes = read_count(text);
  ZSHARD_REQUIRE(bytes && *bytes <= max_prefetch_bytes, error_kind::config,
                 std::string("ZSHARD_ADAMW_PREFETCH='") + text + "' is not a whole number of bytes from 0 to " +
                     std::to_string(max_prefetch_bytes),
                 "set it to 0 (no software prefetch) or a distance such as 2048, or unset it for the CPU's default");
  return *bytes;
}

// This process's distance, read on first use. Throws zshard::error (config) on a malformed
// ZSHARD_ADAMW_PREFETCH; the engine reads it when it is built, so the error comes from there.
inline std::size_t adamw_prefetch_bytes() {
  static const std::size_t bytes = parse_prefetch_bytes(std::getenv("ZSHARD_ADAMW_PREFETCH"));
  return bytes;
}

}  // namespace zshard::optim

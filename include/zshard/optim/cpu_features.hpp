#pragma once
// Which vector paths the host AdamW kernels can take on this CPU. The rest of the program is
// compiled for the baseline ISA; the AVX2 and AVX-512 kernels carry their own `target`
// attributes and are only called after the runtime check below says the CPU (and the OS, which
// must save the wide registers) supports them. The detected features are the library's only
// global state: computed once, read-only afterwards.
#include <cstdint>
#include <string>
#include <string_view>

#include "zshard/core/enum_name.hpp"
#include "zshard/core/error.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif

namespace zshard::optim {

// A path of the host AdamW kernels. `automatic` picks the widest one this CPU runs; the others
// force a path (tests run every path the machine supports; benches compare them).
enum class simd_path : std::uint8_t {
  automatic,
  scalar,       // adamw_update_scalar: the reference, any CPU
  avx2,         // 8 lanes; F16C for f16, integer rounding for bf16
  avx512,       // 16 lanes; integer rounding for bf16
  avx512_bf16,  // 16 lanes; the CPU's own f32 -> bf16 instruction (VCVTNEPS2BF16)
};

constexpr std::string_view to_string(simd_path p) noexcept {
  return enum_name(p, {{simd_path::automatic, "automatic"}, {simd_path::scalar, "scalar"}, {simd_path::avx2, "avx2"},
                       {simd_path::avx512, "avx512"}, {simd_path::avx512_bf16, "avx512_bf16"}});
}

struct cpu_features {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512_bf16 = false;
};

namespace detail {
// F16C is CPUID.1:ECX bit 29; read directly because Clang's __builtin_cpu_supports lacks it.
inline bool cpuid_f16c() noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
#else
  return false;
#endif
}

inline cpu_features detect_cpu_features() noexcept {
  cpu_features f;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks XCR0, i.e. that the OS saves the AVX/AVX-512 state.
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = cpuid_f16c();
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}
}  // namespace detail

// The features of the CPU running this process, detected on first use.
inline const cpu_features& host_cpu() noexcept {
  static const cpu_features features = detail::detect_cpu_features();
  return features;
}

// Whether the kernels for this path were compiled in (x86-64 with GCC or Clang).
constexpr bool simd_paths_compiled() noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

inline bool path_supported(simd_path p, const cpu_features& f = host_cpu()) noexcept {
  const bool x86 = simd_paths_compiled();
  switch (p) {
    case simd_path::automatic:
    case simd_path::scalar:
      return true;
    case simd_path::avx2:
      return x86 && f.avx2 && f.f16c;
    case simd_path::avx512:
      return x86 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    case simd_path::avx512_bf16:
      return path_supported(simd_path::avx512, f) && f.avx512_bf16;
  }
  return false;
}

// The widest path this CPU runs.
inline simd_path best_path(const cpu_features& f = host_cpu()) noexcept {
  for (simd_path p : {simd_path::avx512_bf16, simd_path::avx512, simd_path::avx2})
    if (path_supported(p, f)) return p;
  return simd_path::scalar;
}

// `automatic` becomes the best path; a forced path the CPU cannot run is an error (running it
// would be an illegal instruction).
inline simd_path resolve(simd_path requested) {
  if (requested == simd_path::automatic) return best_path();
  ZSHARD_REQUIRE(path_supported(requested), error_kind::config,
                 "the host AdamW path " + std::string(to_string(requested)) + " is not supported by this CPU",
                 "use simd_path::automatic, or force a path that path_supported() accepts");
  return requested;
}

}  // namespace zshard::optim

#pragma once
// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every checkpoint file.
// Two implementations of the same function: a portable slicing-by-8 table (eight 256-entry
// tables built at compile time, 8 bytes per iteration), and the SSE4.2 `crc32` instruction
// where the CPU has it (x86-64, picked once at run time). Checksumming must keep up with the
// disk or it, not the disk, bounds save and load throughput: the table runs at a few GB/s,
// the instruction several times that. Tests hold both to the standard check value
// (crc32c("123456789") == 0xE3069283) and to each other.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zshard::checkpoint {

namespace detail {

inline constexpr std::uint32_t crc32c_poly = 0x82F63B78u;

constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ crc32c_poly : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s)
    for (std::size_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  return t;
}

inline constexpr auto crc32c_tables = make_crc32c_tables();

// `crc` is the running value in its internal (inverted) form.
inline std::uint32_t crc32c_table_update(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  const auto& t = crc32c_tables;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts only (x86-64, aarch64): the tables assume it
    w ^= crc;
    crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
          t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
  return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ZSHARD_CRC32C_HW 1
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw_update(std::uint32_t crc, const unsigned char* p,
                                                                         std::size_t n) noexcept {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
inline bool crc32c_hw_available() noexcept {
  static const bool ok = __builtin_cpu_supports("sse4.2");
  return ok;
}
#else
#define ZSHARD_CRC32C_HW 0
inline bool crc32c_hw_available() noexcept { return false; }
#endif

}  // namespace detail

enum class crc32c_impl { automatic, table, hardware };

// Running CRC32C over data that arrives in pieces (a file written chunk by chunk).
class crc32c {
 public:
  explicit crc32c(crc32c_impl impl = crc32c_impl::automatic) noexcept
      : hw_(impl != crc32c_impl::table && detail::crc32c_hw_available()) {}

  void update(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
#if ZSHARD_CRC32C_HW
    if (hw_) {
      state_ = detail::crc32c_hw_update(state_, p, n);
      return;
    }
#endif
    state_ = detail::crc32c_table_update(state_, p, n);
  }
  std::uint32_t value() const noexcept { return ~state_; }
  bool uses_hardware() const noexcept { return hw_; }

 private:
  std::uint32_t state_ = 0xffffffffu;
  bool hw_;
};

inline std::uint32_t crc32c_of(const void* data, std::size_t n, crc32c_impl impl = crc32c_impl::automatic) noexcept {
  crc32c c(impl);
  c.update(data, n);
  return c.value();
}

}  // namespace zshard::checkpoint

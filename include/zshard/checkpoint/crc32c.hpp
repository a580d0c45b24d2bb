#pragma once
// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every checkpoint file.
// Two implementations of the same function: a portable slicing-by-8 table (eight 256-entry
// tables built at compile time, 8 bytes per iteration), and the SSE4.2 `crc32` instruction
// where the CPU has it (x86-64, picked once at run time). Checksumming must keep up with the
// disk or it, not the disk, bounds save and load throughput: the table runs at a few GB/s,
// the instruction several times that. The instruction's latency (3 cycles) and not its
// throughput (1 a cycle) bounds one chain of updates, so the hardware path runs three chains
// over three adjacent blocks at once and joins them by multiplying by x^(8 * block) modulo the
// polynomial (as zlib's crc32_combine does): about three times one chain's speed, which a load
// that verifies as it reads needs to keep up with the page cache. Tests hold both to the standard check value
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

// a * b modulo the polynomial, both in the reflected representation (bit 31 is x^0).
constexpr std::uint32_t crc32c_multiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ crc32c_poly : b >> 1;
  }
  return product;
}
// x^(8 * bytes) modulo the polynomial: appending `bytes` zero bytes to a running (raw) CRC
// multiplies it by this.
constexpr std::uint32_t crc32c_zeros_operator(std::uint64_t bytes) noexcept {
  std::uint32_t result = 1u << 31, power = 1u << 23;  // x^0; x^8 (one byte)
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) result = crc32c_multiply(power, result);
    power = crc32c_multiply(power, power);
  }
  return result;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ZSHARD_CRC32C_HW 1
inline constexpr std::size_t crc32c_hw_block = 8192;  // bytes per chain per round
inline constexpr std::uint32_t crc32c_hw_shift = crc32c_zeros_operator(crc32c_hw_block);
// With `out`, the bytes are also copied there, from the same loads: hashing costs no second
// pass over memory.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_hw_update(std::uint32_t crc, const unsigned char* p,
                                                                        std::size_t n,
                                                                        unsigned char* out = nullptr) noexcept {
  std::uint64_t c = crc;
  constexpr std::size_t B = crc32c_hw_block;
  while (n >= 3 * B) {  // three independent chains over adjacent blocks, then joined
    std::uint64_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < B; i += 8) {
      std::uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + B + i, 8);
      std::memcpy(&w2, p + 2 * B + i, 8);
      c = __builtin_ia32_crc32di(c, w0);
      c1 = __builtin_ia32_crc32di(c1, w1);
      c2 = __builtin_ia32_crc32di(c2, w2);
      if (out) {
        std::memcpy(out + i, &w0, 8);
        std::memcpy(out + B + i, &w1, 8);
        std::memcpy(out + 2 * B + i, &w2, 8);
      }
    }
    // CRC(s, X || Y) = CRC(s, X) * x^(8|Y|) ^ CRC(0, Y) for the raw (unconditioned) CRC
    c = crc32c_multiply(crc32c_hw_shift, static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c1);
    c = crc32c_multiply(crc32c_hw_shift, static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c2);
    p += 3 * B;
    n -= 3 * B;
    if (out) out += 3 * B;
  }
  if (out) std::memcpy(out, p, n);  // the tail: under 3 blocks
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
  // Copies n bytes from src to dst and hashes them, in one pass where the CPU allows.
  void update_copy(void* dst, const void* src, std::size_t n) noexcept {
#if ZSHARD_CRC32C_HW
    if (hw_) {
      state_ =
          detail::crc32c_hw_update(state_, static_cast<const unsigned char*>(src), n, static_cast<unsigned char*>(dst));
      return;
    }
#endif
    std::memcpy(dst, src, n);
    update(dst, n);
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

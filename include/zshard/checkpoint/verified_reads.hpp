#pragma once
// Reading what a rank loads from one rank file, and verifying the file's CRC32C in the same
// pass: the file is walked in order, each piece this rank loads is read with pread (straight
// into the engine's host memory, or into the chunk for a dtype conversion or a device copy)
// and hashed there while still in the cache (hashed_reader); the bytes between pieces (the
// header, tensors other ranks load) are read into a small bounce buffer and hashed. Without
// verification only the pieces are read. Memory: the caller's chunk, and a 64 KiB bounce
// buffer on the stack. Nothing is mapped: a file truncated under a load is an error, never a
// signal.
//
// One pass means the engine is written before the last byte is checked: a corrupt file is
// found with the engine partly loaded (sharded_load.hpp says so in the error). verify_file()
// checks a whole file on its own, before anything is loaded, for callers who want the engine
// untouched by a corrupt file at the price of a second read (load_options::verify_before_loading).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zshard/checkpoint/chunked_copy.hpp"
#include "zshard/checkpoint/crc32c.hpp"
#include "zshard/checkpoint/manifest.hpp"
#include "zshard/checkpoint/safetensors_reader.hpp"

namespace zshard::checkpoint {

inline error checksum_mismatch(const std::string& path, std::uint32_t got, std::uint32_t want) {
  char buf[96];
  std::snprintf(buf, sizeof buf, " (CRC32C %08x, the manifest says %08x)", got, want);
  return error(error_kind::io, "'" + path + "' fails its checksum" + std::string(buf) + ": the file is corrupt",
               "restore the file from a copy, or load an earlier checkpoint");
}

// A run of elements of one tensor that this rank loads: numel elements of `from` at file byte
// `offset`, to elements of `to`.
struct load_piece {
  std::uint64_t offset = 0;
  std::uint64_t numel = 0;
  dtype from = dtype::f32, to = dtype::f32;
  char* direct = nullptr;  // host memory of `to` == `from`: the file is read straight into it
  // else: write(first, k, src) takes elements [first, first + k) of the piece, converted to `to`
  std::function<void(std::uint64_t, std::size_t, const void*)> write;
};

// The bytes of one file in order, each read where it goes with pread and hashed there while
// it is still in the cache (a piece of piece_bytes at a time), or, for bytes nobody here loads,
// read into a bounce buffer on the stack and hashed. No mapping of the file: a file truncated
// (or replaced) by someone else while it is loaded is a short read, a zshard::error naming it,
// never a SIGBUS.
class hashed_reader {
 public:
  static constexpr std::size_t piece_bytes = std::size_t{256} << 10;  // within a core's L2
  static constexpr std::size_t bounce_bytes = std::size_t{64} << 10;

  explicit hashed_reader(const safetensors_file& f) : f_(f) {}
  hashed_reader(const hashed_reader&) = delete;
  hashed_reader& operator=(const hashed_reader&) = delete;

  // Bytes [offset, offset + n) into dst (null: hashed only).
  void read(std::uint64_t offset, void* dst, std::size_t n) {
    if (dst) {
      auto* out = static_cast<char*>(dst);
      for (std::size_t done = 0; done < n;) {
        const std::size_t k = std::min(piece_bytes, n - done);
        f_.read_bytes(offset + done, out + done, k);
        crc_.update(out + done, k);
        done += k;
      }
      return;
    }
    char bounce[bounce_bytes];
    for (std::size_t done = 0; done < n;) {
      const std::size_t k = std::min(bounce_bytes, n - done);
      f_.read_bytes(offset + done, bounce, k);
      crc_.update(bounce, k);
      done += k;
    }
  }
  std::uint32_t value() const noexcept { return crc_.value(); }

 private:
  const safetensors_file& f_;
  crc32c crc_;
};

// Checks CRC32C of a whole file on its own (hashed, nothing copied).
inline void verify_file(const safetensors_file& f, const manifest_file& want) {
  hashed_reader h(f);
  h.read(0, nullptr, static_cast<std::size_t>(f.size()));
  if (h.value() != want.crc32c) throw checksum_mismatch(f.path(), h.value(), want.crc32c);
}

// Loads `pieces` (disjoint) from f; with `verify`, hashes every byte of f on the way (each byte
// loaded hashed from the same loads that copy it) and throws checksum_mismatch at the end when
// the file does not match. Without, reads only the pieces, with pread.
template <class Staging>
void read_pieces(const safetensors_file& f, std::vector<load_piece> pieces, const manifest_file* verify,
                 Staging& chunk) {
  std::sort(pieces.begin(), pieces.end(), [](const load_piece& a, const load_piece& b) { return a.offset < b.offset; });
  std::optional<hashed_reader> hashed;
  if (verify) hashed.emplace(f);
  auto read = [&](std::uint64_t offset, void* dst, std::size_t n) {
    if (hashed)
      hashed->read(offset, dst, n);
    else
      f.read_bytes(offset, dst, n);
  };
  std::uint64_t cursor = 0;
  for (const load_piece& pc : pieces) {
    ZSHARD_REQUIRE(pc.offset >= cursor, error_kind::invariant,
                   "checkpoint load: overlapping reads in '" + f.path() + "'");
    if (hashed) hashed->read(cursor, nullptr, static_cast<std::size_t>(pc.offset - cursor));  // bytes nobody here loads
    const std::size_t w = size_of(pc.from);
    if (pc.direct)
      read(pc.offset, pc.direct, static_cast<std::size_t>(pc.numel * w));
    else
      chunked_copy(
          static_cast<char*>(chunk.data()), chunk.bytes(), pc.numel, pc.from, pc.to,
          [&](std::uint64_t first, std::size_t k, void* dst) { read(pc.offset + first * w, dst, k * w); }, pc.write);
    cursor = pc.offset + pc.numel * w;
  }
  if (hashed) {
    hashed->read(cursor, nullptr, static_cast<std::size_t>(f.size() - cursor));
    if (hashed->value() != verify->crc32c) throw checksum_mismatch(f.path(), hashed->value(), verify->crc32c);
  }
}

}  // namespace zshard::checkpoint

#pragma once
// Reading what a rank loads from one rank file, and verifying the file's CRC32C in the same
// pass: the file is walked in order, each piece this rank loads is copied (straight into the
// engine's host memory, or into the chunk for a dtype conversion or a device copy) and hashed
// from the same loads (hashed_reader); the bytes between pieces (the header, tensors other
// ranks load) are only hashed. Without verification only the pieces are read, with pread.
// Memory: the caller's chunk, and a window of the file mapped read-only (page cache).
//
// One pass means the engine is written before the last byte is checked: a corrupt file is
// found with the engine partly loaded (sharded_load.hpp says so in the error). verify_file()
// checks a whole file on its own, before anything is loaded, for callers who want the engine
// untouched by a corrupt file at the price of a second read (load_options::verify_before_loading).
#include <sys/mman.h>
#include <unistd.h>

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

// The bytes of one file in order, each copied where it goes and hashed from the same loads
// (crc32c::update_copy): through a read-only mapping of a window of the file at a time
// (mapped_window_bytes of clean page cache, not allocated memory), or, where the file cannot
// be mapped, read into place with pread and hashed there. Like any mapped file, a file
// truncated by someone else while it is loaded ends the process (SIGBUS).
class hashed_reader {
 public:
  static constexpr std::size_t mapped_window_bytes = std::size_t{4} << 20;

  explicit hashed_reader(const safetensors_file& f) : f_(f) {}
  hashed_reader(const hashed_reader&) = delete;
  hashed_reader& operator=(const hashed_reader&) = delete;
  ~hashed_reader() { unmap(); }

  // Bytes [offset, offset + n) into dst (null: hashed only).
  void read(std::uint64_t offset, void* dst, std::size_t n) {
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      std::size_t k = 0;
      const char* src = window(offset, k);
      k = std::min(k, n);
      if (!src) {  // not mapped: read into place (or a small bounce for hash-only), then hash
        if (out) {
          f_.read_bytes(offset, out, n);
          crc_.update(out, n);
          return;
        }
        char bounce[4096];
        k = std::min(n, sizeof bounce);
        f_.read_bytes(offset, bounce, k);
        crc_.update(bounce, k);
      } else if (out) {
        crc_.update_copy(out, src, k);
      } else {
        crc_.update(src, k);
      }
      offset += k;
      n -= k;
      if (out) out += k;
    }
  }
  std::uint32_t value() const noexcept { return crc_.value(); }

 private:
  // A pointer to byte `offset` in a mapped window and the bytes mapped from there (`avail`);
  // null when mapping fails (then every later call reads instead).
  const char* window(std::uint64_t offset, std::size_t& avail) {
    if (failed_) return nullptr;
    if (!map_ || offset < map_offset_ || offset >= map_offset_ + map_bytes_) {
      unmap();
      static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
      map_offset_ = offset / page * page;
      map_bytes_ = static_cast<std::size_t>(std::min<std::uint64_t>(mapped_window_bytes, f_.size() - map_offset_));
      void* m =
          ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, f_.fd(), static_cast<off_t>(map_offset_));
      if (m == MAP_FAILED) {
        failed_ = true;
        return nullptr;
      }
      map_ = static_cast<char*>(m);
    }
    avail = static_cast<std::size_t>(map_offset_ + map_bytes_ - offset);
    return map_ + (offset - map_offset_);
  }
  void unmap() noexcept {
    if (map_) ::munmap(map_, map_bytes_);
    map_ = nullptr;
  }

  const safetensors_file& f_;
  crc32c crc_;
  char* map_ = nullptr;
  std::uint64_t map_offset_ = 0;
  std::size_t map_bytes_ = 0;
  bool failed_ = false;
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

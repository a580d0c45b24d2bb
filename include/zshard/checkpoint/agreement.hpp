#pragma once
// Ranks agree or fail together (invariant I9 for files): each rank validates on its own, then
// one small collective tells every rank what every other found, so that all ranks throw the
// same error — naming the rank that found it — or all go on. Messages of any length travel
// through the engine's communicator and backend buffers (device memory under NCCL): first
// every rank's length, then, only when some rank has something to say, every message padded
// to the longest.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

// The communicator of every rank of the job: under hybrid sharding the engine's world (its
// comm() is then one shard group's), else its comm(). Checkpoint ranks agree, and meet, over it.
template <class Engine>
auto& job_comm(Engine& eng) {
  if constexpr (requires { eng.world_comm(); })
    return eng.world_comm();
  else
    return eng.comm();
}
// This rank's replica group under hybrid sharding (0 when flat): the replicas of a shard group
// hold the same shards, so only replica 0 writes them.
template <class Engine>
int replica_of(Engine& eng) {
  if constexpr (requires { eng.replica_index(); })
    return eng.replica_index();
  else
    return 0;
}

namespace detail {
// An all_gather of `bytes_per_rank` bytes from every rank (as f32 words: an all_gather copies,
// so the bits arrive intact on every communicator), through backend buffers.
template <class Engine>
std::vector<char> all_gather_bytes(Engine& eng, const void* mine, std::size_t bytes_per_rank) {
  auto& backend = eng.backend();
  auto& comm = job_comm(eng);
  const auto world = static_cast<std::size_t>(comm.size());
  const std::size_t words = (bytes_per_rank + 3) / 4;
  std::vector<char> host(words * 4 * world, '\0');
  std::memcpy(host.data(), mine, bytes_per_rank);
  using B = std::remove_reference_t<decltype(backend)>;
  buffer<B> block(backend, dtype::f32, words, mem_category::scratch);
  buffer<B> all(backend, dtype::f32, words * world, mem_category::scratch);
  auto s = backend.make_stream();
  backend.copy(block.data(), host.data(), words * 4, s);
  backend.synchronize(s);
  comm.all_gather(block.data(), all.data(), words, dtype::f32, comm_stream::of(s));
  backend.copy(host.data(), all.data(), host.size(), s);
  backend.synchronize(s);
  return host;
}
}  // namespace detail

// Every rank's `mine`, whole, in rank order over the job. Collective: one exchange of the
// lengths (8 bytes a rank), and a second of the messages only when one is not empty.
template <class Engine>
std::vector<std::string> exchange_messages(Engine& eng, const std::string& mine) {
  const std::uint64_t my_length = mine.size();
  const std::vector<char> lengths = detail::all_gather_bytes(eng, &my_length, sizeof my_length);
  const std::size_t world = lengths.size() / sizeof my_length;
  std::vector<std::uint64_t> length(world);
  std::memcpy(length.data(), lengths.data(), world * sizeof my_length);
  const std::uint64_t longest = *std::max_element(length.begin(), length.end());
  std::vector<std::string> out(world);
  if (longest == 0) return out;
  std::string padded = mine;
  padded.resize(static_cast<std::size_t>(longest), '\0');
  const std::vector<char> all = detail::all_gather_bytes(eng, padded.data(), padded.size());
  const std::size_t stride = all.size() / world;  // the block, rounded up to whole words
  for (std::size_t r = 0; r < world; ++r) out[r].assign(all.data() + r * stride, static_cast<std::size_t>(length[r]));
  return out;
}

// An error as one string, and back: kind, message and hint survive the trip whatever they hold
// (the message's length is written before it, so no character of it can end it early).
inline std::string encode_error(const error& e) {
  return std::to_string(static_cast<int>(e.kind())) + "\x1f" + std::to_string(e.message().size()) + "\x1f" +
         e.message() + e.hint();
}
inline error decode_error(const std::string& s, int rank, const std::string& what) {
  const auto a = s.find('\x1f');
  const auto b = a == std::string::npos ? a : s.find('\x1f', a + 1);
  int kind = -1;
  std::size_t length = 0;
  bool ok = a != std::string::npos && b != std::string::npos && a > 0 && a < 3 && b > a + 1;
  if (ok) {
    for (std::size_t i = 0; i < b; ++i)
      if (i != a && (s[i] < '0' || s[i] > '9')) ok = false;
  }
  if (ok) {
    kind = std::stoi(s.substr(0, a));
    length = static_cast<std::size_t>(std::stoull(s.substr(a + 1, b - a - 1)));
    ok = kind <= static_cast<int>(error_kind::io) && length <= s.size() - b - 1;
  }
  if (!ok) {  // not written by encode_error: pass it on readable, as an i/o error
    std::string text;
    for (char c : s) text += (static_cast<unsigned char>(c) < 0x20 && c != '\n') ? ' ' : c;
    return error(error_kind::io, what + " (rank " + std::to_string(rank) + "): " + text);
  }
  return error(static_cast<error_kind>(kind), what + " (rank " + std::to_string(rank) + "): " + s.substr(b + 1, length),
               s.substr(b + 1 + length));
}

// Runs `local` (which may throw); then every rank throws the lowest failing rank's error, or
// all return. Collective.
template <class Engine, class Local>
void agree(Engine& eng, const std::string& what, Local&& local) {
  std::string mine;
  try {
    local();
  } catch (const error& e) {
    mine = encode_error(e);
  } catch (const std::exception& e) {
    mine = encode_error(error(error_kind::io, e.what()));
  }
  const auto all = exchange_messages(eng, mine);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) throw decode_error(all[r], static_cast<int>(r), what);
}

}  // namespace zshard::checkpoint

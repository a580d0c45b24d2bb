#pragma once
// Ranks agree or fail together (invariant I9 for files): each rank validates on its own, then
// one small collective tells every rank what every other found, so that all ranks throw the
// same error — naming the rank that found it — or all go on. Messages travel as fixed-size
// blocks through the engine's communicator and backend buffers (device memory under NCCL).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

inline constexpr std::size_t agreement_block_bytes = 1024;

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

// Every rank's `mine` (truncated to the block), in rank order over the job. Collective.
template <class Engine>
std::vector<std::string> exchange_messages(Engine& eng, const std::string& mine) {
  auto& backend = eng.backend();
  auto& comm = job_comm(eng);
  const auto world = static_cast<std::size_t>(comm.size());
  constexpr std::size_t words = agreement_block_bytes / 4;
  std::vector<char> host(agreement_block_bytes * world, '\0');
  std::memcpy(host.data(), mine.data(), std::min(mine.size(), agreement_block_bytes - 1));
  using B = std::remove_reference_t<decltype(backend)>;
  buffer<B> block(backend, dtype::f32, words, mem_category::scratch);
  buffer<B> all(backend, dtype::f32, words * world, mem_category::scratch);
  auto s = backend.make_stream();
  backend.copy(block.data(), host.data(), agreement_block_bytes, s);
  backend.synchronize(s);
  comm.all_gather(block.data(), all.data(), words, dtype::f32, comm_stream::of(s));  // f32 words: a byte copy
  backend.copy(host.data(), all.data(), host.size(), s);
  backend.synchronize(s);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < world; ++r) out.emplace_back(host.data() + r * agreement_block_bytes);
  return out;
}

// An error as one line, and back: kind, message and hint survive the trip.
inline std::string encode_error(const error& e) {
  return std::to_string(static_cast<int>(e.kind())) + "\x1f" + e.message() + "\x1f" + e.hint();
}
inline error decode_error(const std::string& s, int rank, const std::string& what) {
  const auto a = s.find('\x1f'), b = s.find('\x1f', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) return error(error_kind::io, what + ": rank " + std::to_string(rank) + ": " + s);
  const auto kind = static_cast<error_kind>(std::stoi(s.substr(0, a)));
  return error(kind, what + " (rank " + std::to_string(rank) + "): " + s.substr(a + 1, b - a - 1), s.substr(b + 1));
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

#pragma once
// A communicator with a virtual world and no peers: one rank of `world_size` that moves no
// data. With the phantom backend (backend/phantom_backend.hpp) a single engine on rank 0 of a
// virtual world of N ranks simulates what every rank does: under the even partitioner all
// ranks are symmetric (same shard sizes, same gathers, same buckets), so rank 0's ledger is
// every rank's ledger.
//
// Collectives return immediately. They still check what a real communicator checks on the
// calling rank (communicator.hpp: op, root, overlap), so a schedule that would be a usage
// error on threads or NCCL is one here too, except null pointers: a phantom backend's
// buffers are null placeholders. Calls and bytes each rank would send are counted, which is
// the communication volume of the simulated step.
#include <array>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "zshard/comm/communicator.hpp"

namespace zshard {

class null_comm {
 public:
  using zshard_tag = communicator_tag;

  enum class op_kind : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier };
  static constexpr std::size_t op_kinds = 5;

  null_comm(int rank, int world_size) : rank_(rank), size_(world_size) {
    ZSHARD_REQUIRE(world_size >= 1, error_kind::usage,
                   "null_comm world size must be at least 1, got " + std::to_string(world_size));
    ZSHARD_REQUIRE(
        rank >= 0 && rank < world_size, error_kind::usage,
        "rank " + std::to_string(rank) + " is outside a null_comm world of size " + std::to_string(world_size));
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  void all_gather(const void* src, void* dst, std::size_t count, dtype t, comm_stream = {}) {
    const std::size_t block = count * size_of(t);
    if (overlaps(src, block, dst, block * world()) && src != static_cast<const std::byte*>(dst) + block * me())
      throw error(error_kind::usage, "all_gather: src overlaps dst other than as dst + rank() * count (in place)");
    note(op_kind::all_gather, block * (world() - 1));
  }

  void reduce_scatter(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream = {}) {
    ZSHARD_REQUIRE(op != reduce_op::max, error_kind::usage, "reduce_scatter supports sum and average, not max",
                   "use all_reduce with reduce_op::max");
    const std::size_t block = count * size_of(t);
    if (overlaps(src, block * world(), dst, block) && dst != static_cast<const std::byte*>(src) + block * me())
      throw error(error_kind::usage, "reduce_scatter: dst overlaps src other than as src + rank() * count (in place)");
    note(op_kind::reduce_scatter, block * (world() - 1));
  }

  void all_reduce(const void* src, void* dst, std::size_t count, dtype t, reduce_op, comm_stream = {}) {
    const std::size_t bytes = count * size_of(t);
    if (src != dst && overlaps(src, bytes, dst, bytes))
      throw error(error_kind::usage, "all_reduce: src and dst overlap without being equal");
    // A ring all-reduce sends 2 (n - 1) / n of the buffer from each rank.
    note(op_kind::all_reduce, world() > 1 ? 2 * bytes * (world() - 1) / world() : 0);
  }

  void broadcast(void*, std::size_t count, dtype t, int root, comm_stream = {}) {
    ZSHARD_REQUIRE(root >= 0 && root < size_, error_kind::usage,
                   "broadcast: root " + std::to_string(root) + " is outside a world of size " + std::to_string(size_));
    note(op_kind::broadcast, rank_ == root ? count * size_of(t) : 0);
  }

  void barrier(comm_stream = {}) noexcept { note(op_kind::barrier, 0); }

  // split(color, key) as MPI_Comm_split, for a world without peers: null_comm cannot ask the
  // other simulated ranks for their colors, so it takes the rule all of them follow,
  // rule(rank) -> {color, key} (the rule must give this rank the color and key it passes).
  // Without a rule, split is a usage error. The sub-communicator has no rule: set one to split it again.
  using split_rule = std::function<std::pair<int, int>(int rank)>;
  void set_split_rule(split_rule rule) { rule_ = std::move(rule); }

  null_comm split(int color, int key) const {
    ZSHARD_REQUIRE(static_cast<bool>(rule_), error_kind::usage,
                   "null_comm::split: a null communicator has no peers to learn their colors from",
                   "call set_split_rule(rank -> {color, key}) with the rule every simulated rank follows");
    ZSHARD_REQUIRE(color >= 0, error_kind::usage, "split: color " + std::to_string(color) + " must be >= 0");
    ZSHARD_REQUIRE(rule_(rank_) == std::make_pair(color, key), error_kind::usage,
                   "null_comm::split: rank " + std::to_string(rank_) + " passed (color " + std::to_string(color) +
                       ", key " + std::to_string(key) + ") but the split rule gives it another",
                   "pass what the rule gives, or fix the rule");
    std::vector<std::pair<int, int>> members;  // (key, rank) with this color
    for (int q = 0; q < size_; ++q)
      if (const auto ck = rule_(q); ck.first == color) members.emplace_back(ck.second, q);
    std::sort(members.begin(), members.end());
    const auto me = std::find(members.begin(), members.end(), std::make_pair(key, rank_));
    return null_comm(static_cast<int>(me - members.begin()), static_cast<int>(members.size()));
  }

  // What the simulated rank would have done: collectives called and bytes it would send (a
  // ring schedule), per kind.
  std::uint64_t calls(op_kind k) const noexcept { return calls_[index(k)]; }
  std::uint64_t bytes_sent(op_kind k) const noexcept { return bytes_[index(k)]; }
  std::uint64_t total_bytes_sent() const noexcept {
    std::uint64_t n = 0;
    for (auto b : bytes_) n += b;
    return n;
  }

 private:
  static constexpr std::size_t index(op_kind k) noexcept { return static_cast<std::size_t>(k); }
  std::size_t world() const noexcept { return static_cast<std::size_t>(size_); }
  std::size_t me() const noexcept { return static_cast<std::size_t>(rank_); }

  static bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
    if (a == nullptr || b == nullptr) return false;  // phantom placeholders never overlap real memory
    const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
    return a_bytes != 0 && b_bytes != 0 && pa < pb + b_bytes && pb < pa + a_bytes;
  }
  void note(op_kind k, std::size_t bytes) noexcept {
    ++calls_[index(k)];
    bytes_[index(k)] += bytes;
  }

  int rank_;
  int size_;
  split_rule rule_;
  std::array<std::uint64_t, op_kinds> calls_{};
  std::array<std::uint64_t, op_kinds> bytes_{};
};

static_assert(check_communicator<null_comm>());

}  // namespace zshard

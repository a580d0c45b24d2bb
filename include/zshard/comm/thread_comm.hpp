#pragma once
// N ranks as threads in one process: the embedded default communicator, and the one every
// engine test runs on. thread_comm is a light per-rank handle on a thread_world
// (thread_world.hpp: the rendezvous, waiting and failure handling); run_ranks() starts one
// thread per rank and reports the root failure.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/comm/thread_world.hpp"

namespace zshard {

// One rank's handle on a thread_world; cheap to copy. Use each rank from one thread at a time.
class thread_comm {
 public:
  using zshard_tag = communicator_tag;

  thread_comm(thread_world& world, int rank) : world_(&world), rank_(rank) {
    ZSHARD_REQUIRE(
        rank >= 0 && rank < world.size(), error_kind::usage,
        "rank " + std::to_string(rank) + " is outside a thread_world of size " + std::to_string(world.size()));
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_->size(); }
  thread_world& world() const noexcept { return *world_; }

  void all_gather(const void* src, void* dst, std::size_t count, dtype t, comm_stream = {}, const collective_tag& tag = {}) {
    const std::size_t block = count * size_of(t);
    check_pointers("all_gather", src, dst, count);
    if (detail::overlaps(src, block, dst, block * static_cast<std::size_t>(size())) &&
        src != static_cast<const std::byte*>(dst) + block * static_cast<std::size_t>(rank_))
      throw error(error_kind::usage, "all_gather: src overlaps dst other than as dst + rank() * count (in place)");
    enter({detail::collective::all_gather, 0, src, dst, count, t, reduce_op::sum, 0, tag});
    auto* out = static_cast<std::byte*>(dst);
    for (int q = 0; q < size() && block != 0; ++q) {
      const void* from = world_->slot(q).src;
      std::byte* to = out + block * static_cast<std::size_t>(q);
      if (from != to) std::memcpy(to, from, block);
    }
    leave(detail::collective::all_gather);
  }

  // op: sum or average (max is not part of the reduce_scatter contract, see communicator.hpp).
  void reduce_scatter(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream = {}, const collective_tag& tag = {}) {
    ZSHARD_REQUIRE(op != reduce_op::max, error_kind::usage, "reduce_scatter supports sum and average, not max",
                   "use all_reduce with reduce_op::max");
    const std::size_t block = count * size_of(t);
    check_pointers("reduce_scatter", src, dst, count);
    if (detail::overlaps(src, block * static_cast<std::size_t>(size()), dst, block) &&
        dst != static_cast<const std::byte*>(src) + block * static_cast<std::size_t>(rank_))
      throw error(error_kind::usage, "reduce_scatter: dst overlaps src other than as src + rank() * count (in place)");
    enter({detail::collective::reduce_scatter, 0, src, dst, count, t, op, 0, tag});
    detail::visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      // In place is safe: a chunk is read whole before it is stored, and peers never read slice r.
      reduce_range<T>(count * static_cast<std::size_t>(rank_), count, op, static_cast<T*>(dst),
                      [](std::size_t, const T*, std::size_t) {});
    });
    leave(detail::collective::reduce_scatter);
  }

  // src == dst is allowed. Rank r reduces slice r of the elements and writes it to every
  // rank's dst, so the work is split n ways and each slice is reduced exactly once.
  void all_reduce(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream = {}, const collective_tag& tag = {}) {
    const std::size_t bytes = count * size_of(t);
    check_pointers("all_reduce", src, dst, count);
    if (src != dst && detail::overlaps(src, bytes, dst, bytes))
      throw error(error_kind::usage, "all_reduce: src and dst overlap without being equal");
    enter({detail::collective::all_reduce, 0, src, dst, count, t, op, 0, tag});
    const auto [lo, hi] = detail::split_range(count, size(), rank_);
    detail::visit_dtype(t, [&, lo = lo, hi = hi](auto tag) {
      using T = decltype(tag);
      // In place is safe: slice r of any rank's src is read only by rank r, before it is written.
      reduce_range<T>(lo, hi - lo, op, static_cast<T*>(dst) + lo, [&](std::size_t at, const T* r, std::size_t len) {
        for (int q = 0; q < size(); ++q)
          if (q != rank_) std::memcpy(static_cast<T*>(world_->slot(q).dst) + lo + at, r, len * sizeof(T));
      });
    });
    leave(detail::collective::all_reduce);
  }

  void broadcast(void* dst, std::size_t count, dtype t, int root, comm_stream = {}, const collective_tag& tag = {}) {
    ZSHARD_REQUIRE(root >= 0 && root < size(), error_kind::usage,
                   "broadcast: root " + std::to_string(root) + " is outside a world of size " + std::to_string(size()));
    check_pointers("broadcast", dst, dst, count);
    enter({detail::collective::broadcast, 0, nullptr, dst, count, t, reduce_op::sum, root, tag});
    const void* from = world_->slot(root).dst;
    if (rank_ != root && count != 0 && from != dst) std::memcpy(dst, from, count * size_of(t));
    leave(detail::collective::broadcast);
  }

  void barrier(comm_stream = {}) {
    const detail::comm_slot s{detail::collective::barrier, 0, nullptr, nullptr, 0, dtype::f32, reduce_op::sum, 0};
    world_->rendezvous(rank_, detail::collective::barrier, &s, /*last=*/true);
  }

  // Every rank's node (hybrid sharding's node rule): threads of one process share one node.
  std::vector<int> node_ids() const { return std::vector<int>(static_cast<std::size_t>(size()), 0); }

  // The sub-communicator of the ranks that pass the same color (>= 0), ordered by (key, rank),
  // as MPI_Comm_split. A collective: every rank calls it. The group gets a thread_world of its
  // own (same timeout), kept alive by its handles, aborted when this world is, and told when a
  // member's run_ranks function returns (thread_world::retire), so its peers fail at once.
  thread_comm split(int color, int key) {
    const std::int32_t mine[2] = {color, key};
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size()));
    all_gather(mine, all.data(), 2, dtype::f32);        // two int32 as two f32 words: a copy
    std::vector<std::pair<std::int32_t, int>> members;  // (key, rank) of this rank's group
    for (int q = 0; q < size(); ++q) {
      const std::int32_t c = all[2 * static_cast<std::size_t>(q)];
      ZSHARD_REQUIRE(
          c >= 0, error_kind::usage,
          "split: rank " + std::to_string(q) + " passed color " + std::to_string(c) + "; colors must be >= 0",
          "give every rank a group (color); a rank that wants no group can use a group of its own");
      if (c == color) members.emplace_back(all[2 * static_cast<std::size_t>(q) + 1], q);
    }
    std::sort(members.begin(), members.end());
    const int sub_rank = static_cast<int>(
        std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.second == rank_; }) -
        members.begin());
    std::vector<int> ranks;  // this world's ranks in group order
    for (const auto& m : members) ranks.push_back(m.second);
    return thread_comm(world_->child(world_->collectives_entered(rank_), color, ranks), sub_rank);
  }

 private:
  thread_comm(std::shared_ptr<thread_world> owned, int rank) : world_(owned.get()), rank_(rank), owned_(owned) {}

  void check_pointers(const char* what, const void* src, const void* dst, std::size_t count) const {
    if (count != 0 && (src == nullptr || dst == nullptr))
      throw error(error_kind::usage, std::string(what) + " on rank " + std::to_string(rank_) +
                                         ": null buffer with count " + std::to_string(count));
  }
  void enter(const detail::comm_slot& s) { world_->rendezvous(rank_, s.kind, &s, /*last=*/false); }
  void leave(detail::collective what) { world_->rendezvous(rank_, what, nullptr, /*last=*/true); }

  // Reduces elements [begin, begin + len) of every rank's src, in rank order, one chunk at a
  // time, and stores each chunk rounded to T at out + offset; then emit(offset from begin,
  // stored chunk, chunk length) may copy it on. Nothing here allocates or throws: a rank must
  // reach the exit rendezvous once it may read peers' buffers.
  template <class T, class Emit>
  void reduce_range(std::size_t begin, std::size_t len, reduce_op op, T* out, Emit&& emit) const noexcept {
    for (std::size_t done = 0; done < len; done += detail::reduce_chunk) {
      const std::size_t m = std::min(detail::reduce_chunk, len - done);
      const auto src_of = [&](int q) { return static_cast<const T*>(world_->slot(q).src) + begin + done; };
      if (m == detail::reduce_chunk)
        detail::reduce_block<T, detail::reduce_chunk>(src_of, size(), m, op, out + done);
      else
        detail::reduce_block<T, 0>(src_of, size(), m, op, out + done);
      emit(done, static_cast<const T*>(out + done), m);
    }
  }

  thread_world* world_;
  int rank_;
  std::shared_ptr<thread_world> owned_;  // set on a split's handles: keeps the group's world alive
};

static_assert(check_communicator<thread_comm>());
static_assert(tags_collectives<thread_comm>, "thread_comm checks collective tags (communicator.hpp)");

// Runs fn(thread_comm&) on `world_size` threads, one per rank, and joins them. If any rank
// throws, the world is aborted so the others stop instead of hanging, and the root failure
// (the rank whose error or timeout came first, not the "peer failed" errors that followed) is
// rethrown here. fn is called concurrently from every rank thread.
template <class F>
void run_ranks(int world_size, F&& fn, std::chrono::milliseconds timeout = default_comm_timeout) {
  thread_world world(world_size, timeout);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  auto body = [&](int r) {
    try {
      thread_comm comm(world, r);
      fn(comm);
      world.retire(r);  // the others fail now, not at the timeout, if they still wait for this rank
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      world.abort(e.what(), r);
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      world.abort("unknown exception", r);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  try {
    for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  } catch (...) {
    world.abort("could not start rank threads");
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  const int origin = world.failed_rank();
  if (origin >= 0 && errors[static_cast<std::size_t>(origin)])
    std::rethrow_exception(errors[static_cast<std::size_t>(origin)]);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace zshard

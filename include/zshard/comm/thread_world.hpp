#pragma once
// The shared state of N ranks as threads in one process: the rendezvous every collective of
// thread_comm (thread_comm.hpp) goes through, its failure handling, and the reduction kernels.
//
// How a collective runs: each rank publishes its arguments and buffer pointers in its slot and
// meets the others (the "enter" rendezvous, where the last to arrive checks that all ranks
// called the same collective with the same count, dtype, op and root). Each rank then does
// its own share by reading peers' buffers directly, and all meet again ("exit") so nobody
// returns, and frees or reuses a buffer, while a peer still reads it. Every cross-thread read
// is ordered by the mutex taken in the rendezvous, or by the generation counter its last rank
// publishes (release) and waiters observe (acquire), which keeps ThreadSanitizer quiet.
//
// Waiting: a rank that arrived early spins on the generation counter for a budget it learns
// from its recent waits, never against a peer on its own CPU and not on a busy machine
// (adaptive_spin.hpp), then sleeps on the condition variable. Ranks that outnumber the
// hardware threads never spin.
// Reductions accumulate a chunk in f32 on the stack and store it once, straight into the
// output (reduce_scatter: this rank's dst; all_reduce: this rank's dst, then copied to peers').
//
// Failure: thread_world::abort() or a timeout poisons the world; every rank waiting in or
// entering a collective then throws error_kind::comm instead of hanging. A rank about to throw
// while a peer is still between rendezvous (possibly reading its buffers) waits for that peer
// to arrive first, so an abort never frees memory from under a reader.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "zshard/comm/adaptive_spin.hpp"
#include "zshard/comm/communicator.hpp"
#include "zshard/core/enum_name.hpp"

namespace zshard {

inline constexpr std::chrono::milliseconds default_comm_timeout{60'000};

namespace detail {

enum class collective : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier };

constexpr const char* to_string(collective c) noexcept {
  return enum_name<const char*>(c, {{collective::all_gather, "all_gather"},
                                    {collective::reduce_scatter, "reduce_scatter"},
                                    {collective::all_reduce, "all_reduce"}, {collective::broadcast, "broadcast"},
                                    {collective::barrier, "barrier"}});
}

// What a rank publishes on entering a collective; peers read it until the exit rendezvous.
struct comm_slot {
  collective kind = collective::barrier;
  // How many collectives this rank entered before. Ranks meet in lock-step, so it is equal on
  // every rank by construction: it names the collective in messages, and when a rank returns
  // from run_ranks it tells the ranks still waiting how many collectives it made (a skipped
  // call surfaces there at once). A skipped call between same-size collectives is caught by
  // the tags: the next collective's tag (scope, parameter, schedule hash) differs.
  std::uint64_t seq = 0;
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t count = 0;
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  int root = 0;
  collective_tag tag{};
};

inline std::string describe(const comm_slot& s) {
  std::string d = to_string(s.kind);
  if (s.kind != collective::barrier) {
    d += "(count=" + std::to_string(s.count) + ", " + std::string(zshard::to_string(s.type));
    if (s.kind == collective::reduce_scatter || s.kind == collective::all_reduce)
      d += ", " + std::string(zshard::to_string(s.op));
    if (s.kind == collective::broadcast) d += ", root=" + std::to_string(s.root);
    d += ")";
  }
  if (s.tag.use != collective_use::untagged) d += " for " + zshard::describe(s.tag);
  return d + " as collective #" + std::to_string(s.seq);
}

template <class F>
inline void visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32:
      f(float{});
      return;
    case dtype::bf16:
      f(bf16{});
      return;
    case dtype::f16:
      f(f16{});
      return;
  }
}

// Elements [lo, hi) of `count` that rank r of n reduces in all_reduce: an even split.
inline std::pair<std::size_t, std::size_t> split_range(std::size_t count, int n, int r) noexcept {
  const auto un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  const std::size_t base = count / un, extra = count % un;
  const std::size_t lo = ur * base + std::min(ur, extra);
  return {lo, lo + base + (ur < extra ? 1 : 0)};
}

// Reduces src_of(0..n)[0..len) element-wise in rank order into out (f32 accumulation, rounded
// once to T); len <= reduce_chunk. Full chunks are instantiated with a compile-time length:
// a known trip count is what lets -O2's cheap-cost vectoriser take these loops.
inline constexpr std::size_t reduce_chunk = 2048;
template <class T, std::size_t fixed_len, class SrcOf>
inline void reduce_block(const SrcOf& src_of, int n, std::size_t len, reduce_op op, T* out) noexcept {
  const std::size_t m = fixed_len != 0 ? fixed_len : len;
  float acc[reduce_chunk];
  const T* s0 = src_of(0);
  for (std::size_t i = 0; i < m; ++i) acc[i] = to_float(s0[i]);
  for (int q = 1; q < n; ++q) {
    const T* s = src_of(q);
    if (op == reduce_op::max) {
      for (std::size_t i = 0; i < m; ++i) {
        const float x = to_float(s[i]);
        acc[i] = (x > acc[i] || x != x) ? x : acc[i];  // NaN propagates
      }
    } else {
      for (std::size_t i = 0; i < m; ++i) acc[i] += to_float(s[i]);
    }
  }
  if (op == reduce_op::average) {
    const auto fn = static_cast<float>(n);
    for (std::size_t i = 0; i < m; ++i) acc[i] /= fn;  // division, not * (1/n): one rounding
  }
  for (std::size_t i = 0; i < m; ++i) out[i] = from_float<T>(acc[i]);
}

inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace detail

class thread_comm;

// The shared state of n thread ranks. Create it once, give each rank thread a
// thread_comm(world, rank); it must outlive every thread_comm on it.
class thread_world {
 public:
  explicit thread_world(int size, std::chrono::milliseconds timeout = default_comm_timeout)
      : size_(size),
        timeout_(timeout),
        ranks_(static_cast<std::size_t>(size > 0 ? size : 0)),
        spin_(ranks_.size()),
        spin_started_(ranks_.size()),
        cpus_(ranks_.size()) {
    ZSHARD_REQUIRE(size > 0, error_kind::usage, "thread_world size must be at least 1, got " + std::to_string(size));
    ZSHARD_REQUIRE(timeout.count() > 0, error_kind::usage, "thread_world timeout must be positive");
  }
  thread_world(const thread_world&) = delete;
  thread_world& operator=(const thread_world&) = delete;

  int size() const noexcept { return size_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  // Poisons the world: every rank in or entering a collective throws error_kind::comm. The
  // first abort (or timeout, or mismatch) is the root cause; later ones are ignored.
  // Sub-group worlds made by thread_comm::split are aborted with it.
  void abort(std::string reason, int failed_rank = -1) {
    std::vector<std::shared_ptr<thread_world>> children;
    {
      std::lock_guard lk(m_);
      if (failed_rank >= 0) reason = "rank " + std::to_string(failed_rank) + " failed: " + reason;
      poison_locked(failed_rank, reason);
      for (auto& w : children_)
        if (auto c = w.lock()) children.push_back(std::move(c));
    }
    for (auto& c : children) c->abort(reason);
  }
  bool aborted() const {
    std::lock_guard lk(m_);
    return poisoned_;
  }
  // The rank whose failure poisoned the world (-1: none, an outside abort, or a mismatch).
  int failed_rank() const {
    std::lock_guard lk(m_);
    return origin_;
  }
  std::string abort_reason() const {
    std::lock_guard lk(m_);
    return reason_;
  }

  // run_ranks: rank's function returned without an error. A rank waiting in a collective, or
  // entering one later, fails at once naming it instead of waiting out the timeout; in this
  // world and in every group split from it that the rank is in (a hybrid engine's shard and
  // replica groups, nested splits too), where it will not call anything again either.
  void retire(int rank) {
    std::vector<std::pair<std::shared_ptr<thread_world>, int>> groups;
    {
      std::lock_guard lk(m_);
      ranks_[static_cast<std::size_t>(rank)].retired = true;
      if (arrived_ > 0) poison_locked(rank, retired_message_locked(rank));
      cv_.notify_all();
      for (const auto& g : memberships_)
        if (g.rank == rank)
          if (auto w = g.group.lock()) groups.emplace_back(std::move(w), g.rank_in_group);
    }
    for (auto& [w, r] : groups) w->retire(r);  // without m_: a group takes its own lock
  }

 private:
  friend class thread_comm;

  struct rank_state {
    detail::comm_slot slot;  // written under m_ on entry; read by peers until exit
    std::uint64_t next_seq = 0;
    bool arrived = false;  // in the current rendezvous
    bool busy = false;     // between two rendezvous of a collective: may read peers' buffers
    bool retired = false;  // its run_ranks function returned: it enters no more collectives
  };

  // Rank q as messages name it: its rank in the world run_ranks made, and in a split's group also
  // its rank in the group.
  std::string rank_name(int q) const {
    if (world_rank_.empty()) return std::to_string(q);
    return std::to_string(world_rank_[static_cast<std::size_t>(q)]) + " (rank " + std::to_string(q) +
           " of this split group)";
  }

  std::string retired_message_locked(int rank) const {
    const auto& r = ranks_[static_cast<std::size_t>(rank)];
    std::string waiting;
    for (int q = 0; q < size_; ++q)
      if (ranks_[static_cast<std::size_t>(q)].arrived)
        waiting += (waiting.empty() ? "" : ", ") + rank_name(q) + " (in " +
                   detail::describe(ranks_[static_cast<std::size_t>(q)].slot) + ")";
    return "rank " + rank_name(rank) + " returned from its run_ranks function after " + std::to_string(r.next_seq) +
           " collective(s)" + (world_rank_.empty() ? "" : " in this group") + " while rank(s) " +
           (waiting.empty() ? "?" : waiting) + " wait for it: it skipped collectives the others made";
  }

  void poison_locked(int origin, std::string reason) {
    if (!poisoned_) {
      poisoned_ = true;
      origin_ = origin;
      reason_ = std::move(reason);
    }
    cv_.notify_all();
  }

  bool peer_busy_locked() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const rank_state& r) { return r.busy; });
  }

  error aborted_error(int rank, detail::collective what) const {
    return error(error_kind::comm,
                 std::string(detail::to_string(what)) + " on rank " + std::to_string(rank) + " aborted: " + reason_,
                 "the first failure is the root cause and run_ranks rethrows it: fix that one");
  }

  // Leaving by an exception lets the caller free or reuse its buffers, so a rank throws only
  // once no peer is between rendezvous (a peer that passed the enter rendezvous before the
  // poison may still be copying from this rank; its work is bounded and it clears `busy` when
  // it arrives at the exit, where it meets the poison too).
  [[noreturn]] void throw_aborted_when_unread(std::unique_lock<std::mutex>& lk, int rank, detail::collective what) {
    cv_.notify_all();  // a waiter may be waiting for this rank to stop reading
    cv_.wait(lk, [&] { return !peer_busy_locked(); });
    throw aborted_error(rank, what);
  }

  // The last rank into an enter rendezvous checks every rank called the same thing.
  std::string validate_locked() const {
    const detail::comm_slot& a = ranks_[0].slot;
    std::string diff;
    for (int q = 1; q < size_; ++q) {
      const detail::comm_slot& b = ranks_[static_cast<std::size_t>(q)].slot;
      if (b.kind != a.kind || b.seq != a.seq || b.count != a.count || b.type != a.type || b.op != a.op ||
          b.root != a.root || !(b.tag == a.tag))
        diff += ", rank " + std::to_string(q) + " called " + detail::describe(b);
    }
    if (diff.empty()) return diff;
    const bool schedules = a.tag.use != collective_use::untagged;
    return std::string(schedules ? "ranks diverged (different schedules): " : "collective mismatch: ") +
           "rank 0 called " + detail::describe(a) + diff;
  }

  // One rendezvous of `rank`. `publish` is set on a collective's first rendezvous (its
  // arguments); `last` on its final one (after which no rank reads a peer's buffers).
  void rendezvous(int rank, detail::collective what, const detail::comm_slot* publish, bool last) {
    const computing_again_on_exit computing{cpus_, static_cast<std::size_t>(rank)};
    std::unique_lock lk(m_);
    rank_state& me = ranks_[static_cast<std::size_t>(rank)];
    me.busy = false;
    if (poisoned_) throw_aborted_when_unread(lk, rank, what);
    if (publish) {
      me.slot = *publish;
      me.slot.seq = me.next_seq++;
    }
    me.arrived = true;
    for (int q = 0; q < size_; ++q)
      if (ranks_[static_cast<std::size_t>(q)].retired) {
        poison_locked(q, retired_message_locked(q));
        throw_aborted_when_unread(lk, rank, what);
      }
    const std::uint64_t gen = generation_.load(std::memory_order_relaxed);  // written under m_ only
    if (++arrived_ == size_) {
      if (publish) mismatch_ = validate_locked();
      const bool go_on = !last && mismatch_.empty();
      for (rank_state& r : ranks_) {
        r.arrived = false;
        r.busy = go_on;
      }
      arrived_ = 0;
      if (publish && !mismatch_.empty()) poison_locked(-1, mismatch_);
      cv_.notify_all();
      generation_.store(gen + 1, std::memory_order_release);  // last: spinners may leave at once
    } else if (lk.unlock(); spin_until_advanced(rank, gen)) {
      // The last rank published everything this rank reads next (slots, busy flags, mismatch_)
      // before its release store of the generation, which spin_until_advanced acquired.
    } else {
      lk.lock();
      auto deadline = std::chrono::steady_clock::now() + timeout_;
      while (generation_.load(std::memory_order_relaxed) == gen) {
        if (poisoned_ && !peer_busy_locked()) throw aborted_error(rank, what);
        if (cv_.wait_until(lk, deadline) != std::cv_status::timeout ||
            generation_.load(std::memory_order_relaxed) != gen || poisoned_)
          continue;
        if (peer_busy_locked()) {  // a peer is still reading buffers (its work is bounded): wait on
          deadline = std::chrono::steady_clock::now() + timeout_;
          continue;
        }
        std::string missing;
        for (int q = 0; q < size_; ++q)
          if (!ranks_[static_cast<std::size_t>(q)].arrived) missing += (missing.empty() ? "" : ", ") + rank_name(q);
        std::string msg = std::string(detail::to_string(what)) + " on rank " + std::to_string(rank) +
                          " timed out after " + std::to_string(timeout_.count()) + " ms waiting for rank(s) " + missing;
        poison_locked(rank, msg);
        throw error(error_kind::comm, msg,
                    "every rank must call the same collectives in the same order; a rank that skipped one, "
                    "returned early or hangs stops the others. Raise the thread_world timeout only if ranks are "
                    "legitimately slow");
      }
      learn_wait(rank);
    }
    // mismatch_ is stable here: it is rewritten only by a rendezvous this rank has not joined yet.
    if (publish && !mismatch_.empty())
      throw error(
          error_kind::comm,
          std::string(detail::to_string(what)) + " on rank " + std::to_string(rank) + ": " + mismatch_,
          "every rank must call the same collectives in the same order with the same count, dtype, op and root");
  }

  // Spins until the generation leaves `gen`, at most rank's learned budget (adaptive_spin.hpp);
  // true if it left. Called without m_. Not at all when ranks outnumber hardware threads: then
  // a spinning rank always holds a core a late rank needs.
  bool spin_until_advanced(int rank, std::uint64_t gen) {
    if (crowded_) return false;
    const auto r = static_cast<std::size_t>(rank);
    const int cpu = detail::current_cpu();
    spin_[r].check_contention();
    spin_started_[r] = detail::adaptive_spin::clock::now();
    return spin_[r].spin([&] { return generation_.load(std::memory_order_acquire) != gen; },
                         [&] { return cpus_.peer_computing_on(r, cpu); }, spin_started_[r]);
  }
  // A wait that the spin did not catch has just ended (the rank slept): its length teaches the budget.
  void learn_wait(int rank) {
    if (crowded_) return;
    const auto r = static_cast<std::size_t>(rank);
    spin_[r].learn(detail::adaptive_spin::clock::now() - spin_started_[r], /*caught=*/false);
  }

  const detail::comm_slot& slot(int q) const noexcept { return ranks_[static_cast<std::size_t>(q)].slot; }

  // The world of sub-group `color` made by the split that was collective number `seq`, whose
  // members are these ranks of this world in group order: the first member to ask creates it
  // (and records who is in it, for retire()), the last one to ask drops it from the registry.
  std::shared_ptr<thread_world> child(std::uint64_t seq, int color, const std::vector<int>& members) {
    std::shared_ptr<thread_world> w;
    {
      std::lock_guard lk(m_);
      auto& entry = splits_[{seq, color}];
      if (!entry.first) {
        const int n = static_cast<int>(members.size());
        entry = {std::make_shared<thread_world>(n, timeout_), n};
        // A group's ranks share the cores with every other rank of this world: a group of 2 out
        // of 4 ranks on 2 cores is as crowded as its parent, and must not spin either.
        entry.first->crowded_ = entry.first->crowded_ || crowded_;
        // Set before any other thread can see the group (it is handed out under m_), then read only.
        for (int q : members)
          entry.first->world_rank_.push_back(world_rank_.empty() ? q : world_rank_[static_cast<std::size_t>(q)]);
        std::erase_if(memberships_, [](const membership& m) { return m.group.expired(); });  // groups gone
        for (int i = 0; i < n; ++i) memberships_.push_back({entry.first, members[static_cast<std::size_t>(i)], i});
        children_.push_back(entry.first);
      }
      w = entry.first;
      if (--entry.second == 0) splits_.erase({seq, color});
    }
    if (aborted()) w->abort(abort_reason());
    return w;
  }
  std::uint64_t collectives_entered(int rank) const {
    std::lock_guard lk(m_);
    return ranks_[static_cast<std::size_t>(rank)].next_seq;
  }

  int size_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::vector<rank_state> ranks_;
  int arrived_ = 0;
  // Written under m_ (by the last rank into a rendezvous); read by spinning ranks without it.
  std::atomic<std::uint64_t> generation_{0};
  // Each rank's spin budget and the start of its current spin: touched only by that rank's
  // thread (a rank is used from one thread at a time), so they need no lock.
  std::vector<detail::adaptive_spin> spin_;
  std::vector<detail::adaptive_spin::clock::time_point> spin_started_;
  detail::running_cpus cpus_;
  // Marks a rank as waiting while it is inside rendezvous(), and where it computes once it leaves
  // (also when it leaves by an exception).
  struct computing_again_on_exit {
    detail::running_cpus& cpus;
    std::size_t rank;
    computing_again_on_exit(detail::running_cpus& c, std::size_t r) : cpus(c), rank(r) { cpus.waiting(rank); }
    ~computing_again_on_exit() { cpus.computing(rank); }
    computing_again_on_exit(const computing_again_on_exit&) = delete;
    computing_again_on_exit& operator=(const computing_again_on_exit&) = delete;
  };
  // More ranks than hardware threads (in this world or, for a split's group, its parent): never spin.
  bool crowded_ = std::thread::hardware_concurrency() != 0 &&
                  static_cast<unsigned>(size_) > std::thread::hardware_concurrency();
  std::string mismatch_;
  bool poisoned_ = false;
  int origin_ = -1;
  std::string reason_;
  std::map<std::pair<std::uint64_t, int>, std::pair<std::shared_ptr<thread_world>, int>> splits_;
  std::vector<std::weak_ptr<thread_world>> children_;
  // Which rank of this world is which rank of each split's group (retire() tells the groups).
  struct membership {
    std::weak_ptr<thread_world> group;
    int rank, rank_in_group;
  };
  std::vector<membership> memberships_;
  // A split's group: each rank's rank in the world run_ranks made (messages); empty for that world.
  std::vector<int> world_rank_;
};

}  // namespace zshard

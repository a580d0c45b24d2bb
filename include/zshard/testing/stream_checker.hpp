#pragma once
// A race detector for stream ordering, so CPU tests can prove that work put on the role streams
// (compute, gather, reduce, host_copy) is ordered with events the way an asynchronous backend
// (CUDA) needs, without a GPU.
//
// checked_backend runs everything at once on the host, exactly as host_backend does (the values
// are the same), and in addition keeps a vector clock per stream: work on a stream is ordered
// after earlier work on it, after what an event it waited on had seen when recorded, and after
// whatever the host had waited for (synchronize) when it enqueued the work. Every access to
// memory the backend handed out is checked against the earlier accesses to that allocation: a
// read must be ordered after the last write, a write (and a free) after the last write and
// every read since. An unordered pair is a race on a real device even though the host schedule
// happens to give the right values, and is recorded as a readable violation.
//
// checked_comm wraps a communicator so its collectives count as work on the stream they are
// given (comm_stream), as NCCL's are; inside group_start()/group_end() they are held back and
// run at group_end(), as NCCL launches a group, so work that wrongly depends on a collective of
// its own group reads what was there before. The training stack's own kernels are invisible to the
// backend: tests report them with note_access().
//
// Host waits (synchronize, wait_host, grad_stats_of) go through core/host_wait.hpp as on CUDA:
// they are counted (host_waits(), so tests can bound round trips per step), they run the
// backend's watch, and hold_streams(true) injects a wait that never finishes on its own — the
// stream stuck behind a hung collective — so tests can prove a wait polls its checks and stops.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zshard/backend/backend.hpp"
#include "zshard/comm/communicator.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/host_wait.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/grad_clip.hpp"

namespace zshard::testing {

template <class Comm>
class checked_comm;

class checked_backend {
 public:
  using zshard_tag = backend_tag;
  static constexpr bool holds_storage = true;
  static constexpr std::size_t alignment = 64;  // as host_backend: kernels may assume it
  // Clock components: one per stream_role, then the host, which joins a stream's clock when it
  // synchronizes and passes what it has seen on to everything it enqueues afterwards.
  static constexpr int host = static_cast<int>(stream_role_count);
  static constexpr std::size_t participants = stream_role_count + 1;
  static constexpr std::size_t max_violations = 50;  // the first ones are the informative ones
  using vector_clock = std::array<std::uint64_t, participants>;

  struct stream {
    int id = 0;  // a stream_role value
    int handle() const noexcept { return id; }
  };
  struct event {
    vector_clock clock{};
    bool recorded = false;
  };

  explicit checked_backend(std::optional<std::size_t> budget_bytes = std::nullopt, std::string name = "checked")
      : ledger_(std::move(name), budget_bytes) {}
  // Owns the live allocations it tracks: copies would free them twice.
  checked_backend(const checked_backend&) = delete;
  checked_backend& operator=(const checked_backend&) = delete;
  // The ledger still shows leaks; freeing them keeps a failed test from adding sanitizer noise.
  ~checked_backend() {
    for (const auto& [base, a] : live_) std::free(reinterpret_cast<void*>(base));
  }

  memory_ledger& ledger() noexcept { return ledger_; }
  const memory_ledger& ledger() const noexcept { return ledger_; }

  // Memory allocated on s is written by s: other streams must wait for s before touching it.
  void* allocate(std::size_t bytes, mem_category c) { return allocate(bytes, c, stream{}); }
  void* allocate(std::size_t bytes, mem_category c, const stream& s) {
    const int id = checked(s);
    if (bytes == 0) return nullptr;
    ledger_.charge(c, bytes);  // throws before anything is allocated
    void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (!p) {
      ledger_.release(c, bytes);
      throw error(error_kind::backend, "checked allocation of " + std::to_string(bytes) + " bytes for " +
                                           std::string(to_string(c)) + " failed");
    }
    live_.emplace(address(p),
                  allocation{bytes, c, {}, {}, std::string(to_string(c)) + "#" + std::to_string(++serial_), id});
    ++allocations_[static_cast<std::size_t>(c)];
    touch("allocate", id, begin(id), p, bytes, true);
    return p;
  }
  // A free is a write: every earlier use, on any stream, must be ordered before it.
  void deallocate(void* p, std::size_t bytes, mem_category c) noexcept { deallocate(p, bytes, c, stream{}); }
  void deallocate(void* p, std::size_t bytes, mem_category c, const stream& s) noexcept {
    if (!p) return;
    const auto it = live_.find(address(p));
    if (it == live_.end()) return report("deallocate: pointer was not allocated by this backend (or freed twice)");
    // No throwing here (buffers free in destructors): a bad stream is reported and taken as compute.
    const bool known = s.id >= 0 && s.id < host;
    if (!known) report("deallocate: stream id " + std::to_string(s.id) + " is not a stream_role");
    const int id = known ? s.id : 0;
    touch("deallocate", id, begin(id), p, bytes, true);
    const allocation a = std::move(it->second);
    if (a.bytes != bytes || a.category != c)
      report("deallocate: " + a.label + " (" + std::to_string(a.bytes) + " bytes) freed as " + std::to_string(bytes) +
             " bytes of " + std::string(to_string(c)));
    if (a.stream != id) ++cross_stream_frees_[static_cast<std::size_t>(a.category)];
    live_.erase(it);
    std::free(p);
    ledger_.release(a.category, a.bytes);  // what was charged, so a bad call cannot throw here
  }

  stream make_stream() { return stream{}; }
  stream role_stream(stream_role r) const noexcept { return stream{static_cast<int>(r)}; }
  event make_event() { return {}; }
  void record(event& e, const stream& s) {
    const int id = checked(s);
    enqueue(id);
    e.clock = vc_[id];
    e.recorded = true;
  }
  void wait(const stream& s, const event& e) {
    const int id = checked(s);
    if (!e.recorded) return;  // as CUDA: waiting on an event never recorded orders nothing
    enqueue(id);
    join(vc_[id], e.clock);
  }
  void synchronize(const stream& s) {
    const int id = checked(s);
    host_wait("synchronize");
    join(vc_[host], vc_[id]);
  }
  // Has the work before e's record finished? Never blocks; false while streams are held. Safe
  // from helper threads (it reads only the event and the hold).
  bool ready(const event& e) const noexcept { return e.recorded && !held_.load(); }
  // The host waits for the work before e's record.
  void wait_host(const event& e) {
    host_wait("wait_host");
    if (e.recorded) join(vc_[host], e.clock);
  }

  // ---- host waits (see the header comment) ---------------------------------------------------
  wait_watch& watch() noexcept { return watch_; }
  // While held, no stream finishes: every host wait polls (running the watch) until released
  // from another thread, or throws after wait_timeout().
  void hold_streams(bool held) noexcept { held_.store(held); }
  void set_wait_timeout(std::chrono::milliseconds t) noexcept { wait_timeout_ = t; }
  std::chrono::milliseconds wait_timeout() const noexcept { return wait_timeout_; }
  std::size_t host_waits() const noexcept { return host_waits_; }

  void copy(void* dst, const void* src, std::size_t bytes, const stream& s) {
    const auto [id, t] = op(s);
    touch("copy", id, t, src, bytes, false);
    touch("copy", id, t, dst, bytes, true);
    if (bytes) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, std::size_t bytes, const stream& s) {
    const auto [id, t] = op(s);
    touch("fill_zero", id, t, dst, bytes, true);
    if (bytes) std::memset(dst, 0, bytes);
  }
  void convert(const void* src, dtype src_type, void* dst, dtype dst_type, std::size_t n, const stream& s) {
    const auto [id, t] = op(s);
    touch("convert", id, t, src, n * size_of(src_type), false);
    touch("convert", id, t, dst, n * size_of(dst_type), true);
    zshard::convert(src, src_type, dst, dst_type, n);
  }
  void add_into(float* dst, const float* src, std::size_t n, const stream& s) {
    const auto [id, t] = op(s);
    touch("add_into", id, t, src, n * sizeof(float), false);
    touch("add_into", id, t, dst, n * sizeof(float), true);  // a write covers the read of dst
    for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  // Synchronous, as on every backend: the host waits for s to have the result.
  grad_stats grad_stats_of(const float* g, std::size_t n, const stream& s) {
    const auto [id, t] = op(s);
    touch("grad_stats_of", id, t, g, n * sizeof(float), false);
    host_wait("grad_stats_of");
    join(vc_[host], vc_[id]);
    optim::norm_accumulator acc;
    acc.add(g, n, 1.0f);
    return {acc.sum_squares, acc.nonfinite};
  }
  // *out (8 bytes of backend memory) = sum of g[i]^2 in f64, enqueued on s: no host wait, as
  // cuda_backend's; the same arithmetic as grad_stats_of, so results match bit for bit.
  void sum_squares_into(const float* g, std::size_t n, double* out, const stream& s) {
    const auto [id, t] = op(s);
    touch("sum_squares_into", id, t, g, n * sizeof(float), false);
    touch("sum_squares_into", id, t, out, sizeof(double), true);
    optim::norm_accumulator acc;
    acc.add(g, n, 1.0f);
    *out = acc.sum_squares;
  }
  void adamw(const optim::adamw_step& step, float* master, float* m, float* v, const float* grad, std::size_t n,
             void* working_out, dtype working_type, const stream& s) {
    const auto [id, t] = op(s);
    touch("adamw", id, t, grad, n * sizeof(float), false);
    for (float* state : {master, m, v}) touch("adamw", id, t, state, n * sizeof(float), true);
    touch("adamw", id, t, working_out, n * size_of(working_type), true);
    optim::adamw_update_scalar(step, master, m, v, grad, n, working_out, working_type);
  }
  // The batched kernels cuda_backend has (backend.hpp's batched_sum_squares, batched_adamw), so
  // the engine runs the same path here as on a GPU: each tensor as the single-tensor call.
  void sum_squares_batch(std::span<const float* const> x, std::span<const std::size_t> n, double* out,
                         const stream& s) {
    for (std::size_t i = 0; i < x.size(); ++i) sum_squares_into(x[i], n[i], out + i, s);
  }
  void adamw_batch(std::span<const adamw_task> tasks, bool zero_grad, const stream& s) {
    for (const adamw_task& t : tasks) {
      adamw(t.step, t.master, t.m, t.v, t.grad, t.n, t.working_out, t.working_type, s);
      if (zero_grad) fill_zero(t.grad, t.n * sizeof(float), s);
    }
  }

  // Work the backend does not run (the training stack's kernels on views the engine hands out):
  // one operation on role r's stream that reads or writes [p, p + bytes).
  void note_access(const void* p, std::size_t bytes, bool write, stream_role r) {
    const auto [id, t] = op(role_stream(r));
    touch("note_access", id, t, p, bytes, write);
  }
  // Whether work enqueued on r now would be ordered after the last write to the allocation
  // holding p: for tests of how little a stream waits (false for memory not tracked here).
  bool sees_last_write(stream_role r, const void* p) const {
    auto it = live_.upper_bound(address(p));
    if (it == live_.begin()) return false;
    --it;
    if (address(p) >= it->first + it->second.bytes) return false;
    const mark& w = it->second.last_write;
    const auto seen = [&](int participant) {
      return vc_[static_cast<std::size_t>(participant)][std::size_t(w.stream)];
    };
    return std::max(seen(static_cast<int>(r)), seen(host)) >= w.tick;  // enqueuing joins the host's clock
  }
  const std::vector<std::string>& violations() const noexcept { return violations_; }
  // Allocations of a category, and those freed on another stream than the one they were
  // allocated on: a stream-ordered pool (CUDA's) reuses a block freed on the allocating stream at
  // once, one freed elsewhere only once it knows the free completed (docs/DESIGN.md).
  std::size_t allocations(mem_category c) const noexcept { return allocations_[static_cast<std::size_t>(c)]; }
  std::size_t cross_stream_frees(mem_category c) const noexcept {
    return cross_stream_frees_[static_cast<std::size_t>(c)];
  }
  // Accesses that fell in a live allocation: proof that the checker saw the work at all.
  std::size_t checked_accesses() const noexcept { return checked_accesses_; }

 private:
  template <class Comm>
  friend class checked_comm;

  struct mark {
    int stream = 0;
    std::uint64_t tick = 0;  // tick 0 is before everything: "no access yet"
  };
  struct allocation {
    std::size_t bytes;
    mem_category category;
    mark last_write;
    std::vector<mark> reads;  // since last_write, the latest per stream (it orders the earlier)
    std::string label;
    int stream = 0;  // allocated in this stream's order
  };
  struct range {
    const void* p;
    std::size_t bytes;
    bool write;
  };

  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  static std::string_view name(int participant) noexcept {
    return participant == host ? "host" : to_string(static_cast<stream_role>(participant));
  }
  static int checked(const stream& s) {
    ZSHARD_REQUIRE(s.id >= 0 && s.id < host, error_kind::usage,
                   "checked_backend: stream id " + std::to_string(s.id) + " is not a stream_role");
    return s.id;
  }
  static void join(vector_clock& into, const vector_clock& from) noexcept {
    for (std::size_t i = 0; i < participants; ++i) into[i] = std::max(into[i], from[i]);
  }
  // The host enqueues all work, so work enqueued now is ordered after what the host waited for.
  void enqueue(int id) noexcept { join(vc_[static_cast<std::size_t>(id)], vc_[host]); }
  std::uint64_t begin(int id) noexcept {
    enqueue(id);
    return ++vc_[static_cast<std::size_t>(id)][static_cast<std::size_t>(id)];
  }
  std::pair<int, std::uint64_t> op(const stream& s) {
    const int id = checked(s);
    return {id, begin(id)};
  }
  // Several accesses as one operation (one tick): a collective reads and writes at once.
  void operation(const char* what, const stream& s, std::initializer_list<range> ranges) {
    const auto [id, t] = op(s);
    for (const range& r : ranges) touch(what, id, t, r.p, r.bytes, r.write);
  }

  void host_wait(const char* what) {
    ++host_waits_;
    poll_until([&] { return !held_.load(); }, wait_limits{wait_timeout_, &watch_, nullptr},
               std::string("checked_backend: ") + what);
  }

  void report(std::string line) {
    if (violations_.size() < max_violations) violations_.push_back(std::move(line));
  }

  void touch(const char* what, int id, std::uint64_t tick, const void* p, std::size_t bytes, bool write) {
    if (p == nullptr || bytes == 0) return;
    auto it = live_.upper_bound(address(p));
    if (it == live_.begin()) return;
    --it;
    allocation& a = it->second;
    if (address(p) >= it->first + a.bytes) return;  // host memory or another space: not ours to check
    ++checked_accesses_;
    const std::string access = std::string(what) + ": " + std::string(name(id)) + (write ? " write of " : " read of ") +
                               a.label + " (" + std::to_string(a.bytes) + " bytes)";
    if (address(p) + bytes > it->first + a.bytes)
      report(access + " runs " + std::to_string(address(p) + bytes - it->first - a.bytes) + " bytes past its end");
    const vector_clock& vc = vc_[static_cast<std::size_t>(id)];
    const auto unordered = [&](const mark& m) { return vc[static_cast<std::size_t>(m.stream)] < m.tick; };
    const auto conflict = [&](const mark& m, const char* kind) {
      report(access + " is not ordered after the " + kind + " on " + std::string(name(m.stream)) +
             " (record an event there and wait on it, or synchronize)");
    };
    if (unordered(a.last_write)) {
      conflict(a.last_write, "write");
    } else if (write) {
      const auto r = std::find_if(a.reads.begin(), a.reads.end(), unordered);
      if (r != a.reads.end()) conflict(*r, "read");
    }
    if (write) {
      a.last_write = {id, tick};
      a.reads.clear();
    } else {
      const auto r = std::find_if(a.reads.begin(), a.reads.end(), [&](const mark& m) { return m.stream == id; });
      if (r != a.reads.end())
        r->tick = tick;
      else
        a.reads.push_back({id, tick});
    }
  }

  memory_ledger ledger_;
  std::array<vector_clock, participants> vc_{};
  std::map<std::uintptr_t, allocation> live_;  // by base address, for upper_bound lookups
  std::vector<std::string> violations_;
  std::array<std::size_t, mem_category_count> allocations_{}, cross_stream_frees_{};
  std::size_t checked_accesses_ = 0;
  std::uint64_t serial_ = 0;
  wait_watch watch_;
  std::atomic<bool> held_{false};
  std::chrono::milliseconds wait_timeout_{10'000};
  std::size_t host_waits_ = 0;
};

static_assert(check_backend<checked_backend>());
static_assert(has_role_streams<checked_backend> && stream_ordered_memory<checked_backend>);

// A communicator whose collectives count as one operation each on the stream of a
// checked_backend they are given (compute when none), as NCCL's run on theirs. The
// inner communicator still does the work, before returning.
template <class Comm>
class checked_comm {
 public:
  using zshard_tag = communicator_tag;

  checked_comm(Comm& inner, checked_backend& backend) : inner_(&inner), backend_(&backend) {}

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  // Collective tags pass through to the inner communicator (it checks them, if it takes them).
  void all_gather(const void* src, void* dst, std::size_t count, dtype t, comm_stream cs = {},
                  const collective_tag& tag = {}) {
    const std::size_t block = count * size_of(t);
    issue([=, this, s = on(cs)] {
      backend_->operation("all_gather", s, {{src, block, false}, {dst, block * world(), true}});
      tagged::all_gather(*inner_, src, dst, count, t, {}, tag);
    });
  }
  void reduce_scatter(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream cs = {},
                      const collective_tag& tag = {}) {
    const std::size_t block = count * size_of(t);
    issue([=, this, s = on(cs)] {
      backend_->operation("reduce_scatter", s, {{src, block * world(), false}, {dst, block, true}});
      tagged::reduce_scatter(*inner_, src, dst, count, t, op, {}, tag);
    });
  }
  void all_reduce(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream cs = {},
                  const collective_tag& tag = {}) {
    const std::size_t bytes = count * size_of(t);
    issue([=, this, s = on(cs)] {
      backend_->operation("all_reduce", s, {{src, bytes, false}, {dst, bytes, true}});
      tagged::all_reduce(*inner_, src, dst, count, t, op, {}, tag);
    });
  }
  void broadcast(void* dst, std::size_t count, dtype t, int root, comm_stream cs = {}, const collective_tag& tag = {}) {
    issue([=, this, s = on(cs)] {
      backend_->operation("broadcast", s, {{dst, count * size_of(t), true}});  // read and written in place
      if constexpr (tags_collectives<Comm>)
        inner_->broadcast(dst, count, t, root, {}, tag);
      else
        inner_->broadcast(dst, count, t, root);
    });
  }
  void barrier(comm_stream = {}) {
    ZSHARD_REQUIRE(group_depth_ == 0, error_kind::usage, "barrier() inside a group_start()/group_end() pair");
    inner_->barrier();
  }

  // Nestable; the held collectives run, in order, when the outermost group ends.
  void group_start() { ++group_depth_; }
  void group_end() {
    ZSHARD_REQUIRE(group_depth_ > 0, error_kind::usage, "group_end() without group_start()");
    if (--group_depth_ > 0) return;
    auto held = std::move(held_);
    held_.clear();
    for (auto& run : held) run();
  }
  std::size_t groups_launched() const noexcept { return groups_launched_; }

 private:
  std::size_t world() const { return static_cast<std::size_t>(size()); }
  // The checked stream a collective given cs runs on: compute when it names none.
  static checked_backend::stream on(comm_stream cs) {
    return {checked_backend::checked(checked_backend::stream{cs.as<int>()})};
  }
  template <class Run>
  void issue(Run&& run) {
    if (group_depth_ == 0) return run();
    if (held_.empty()) ++groups_launched_;
    held_.emplace_back(std::forward<Run>(run));
  }

  Comm* inner_;
  checked_backend* backend_;
  int group_depth_ = 0;
  std::vector<std::function<void()>> held_;  // collectives of the open group
  std::size_t groups_launched_ = 0;          // groups that held at least one collective
};

static_assert(check_communicator<checked_comm<thread_comm>>() && groupable<checked_comm<thread_comm>>);

}  // namespace zshard::testing

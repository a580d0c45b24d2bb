#pragma once
// The NCCL communicator: the communicator concept over device pointers, one rank per GPU.
// Two ways to make one:
//   - one process per GPU: nccl_comm(id, nranks, rank, device). The caller ships the id that
//     rank 0 got from nccl_comm::make_unique_id() to the other processes (MPI, a file, ...).
//   - one process driving several GPUs: nccl_comm::create_local(devices), then one thread per
//     rank (run_nccl_ranks, comm/nccl_ranks.hpp, does both).
//
// Streams: each collective takes the stream it runs on (comm_stream, last argument), the one
// that orders its buffers. The engine passes the backend's gather stream for gathers, its
// reduce stream for reductions and compute for the rest (see state/stream_roles.hpp). A
// collective given no stream runs on a stream of the communicator's own.
//
// Completion: with nccl_completion::wait (the default) a collective returns when it has
// finished on the GPU; with ::enqueue it returns once enqueued, and synchronize() waits. Both
// poll cudaStreamQuery and ncclCommGetAsyncError, so a failed peer, a network error or a rank
// that never arrives turns into zshard::error(error_kind::comm) after options().timeout, and
// the communicator is aborted (ncclCommAbort): never a silent hang. The communicator is
// created non-blocking for the same reason: initialisation waiting for absent ranks times out.
// Waits outside the communicator (cuda_backend::synchronize, copies to the host) reach the same
// checks through poll_health(), which the engine registers in the backend's wait_watch. A wait
// sees an error at its next poll (core/host_wait.hpp: microseconds), then aborts: ncclCommAbort
// stops NCCL's own kernels but frees NCCL's device memory, which waits for the other work queued
// on the device, so the wait returns once that work (the kernels ahead of a hung collective) is
// done (tests/gpu/readiness_cases.hpp measures both).
//
// Teardown aborts instead of waiting when anything went wrong: a failed or cancelled
// communicator, or one destroyed while an exception unwinds (its peers may wait for
// collectives it will never issue). A failure sets options().report_failure, which
// run_nccl_ranks (comm/nccl_ranks.hpp) shares as every rank's cancel flag, so the peers stop at their next poll.
//
// Differences from the contract in communicator.hpp, inherent to NCCL: reductions run in
// NCCL's order (ring/tree), not rank order, and bf16/f16 accumulate in their own type, so
// results match the thread communicator within rounding, not bitwise (every rank still gets
// identical all_reduce results); count == 0 does not synchronise ranks; mismatched arguments
// across ranks are not detected (they hang, and the timeout reports it).
//
// Runtime API and NCCL only: plain C++ translation units may include it. Link NCCL and cudart.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zshard/backend/cuda_check.hpp"
#include "zshard/comm/communicator.hpp"
#include "zshard/comm/nccl_options.hpp"

namespace zshard {

class nccl_comm {
 public:
  using zshard_tag = communicator_tag;

  // Rank 0 calls this and gives the id to every rank (the MPI bootstrap's job).
  static ncclUniqueId make_unique_id() {
    ncclUniqueId id{};
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw error(error_kind::comm, std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r),
                  "NCCL needs a usable network interface for its bootstrap (see NCCL_SOCKET_IFNAME)");
    return id;
  }

  // One rank of nranks, on `device`. Blocks until every rank has joined, or throws after
  // options.timeout (a rank that never comes, a wrong id).
  nccl_comm(const ncclUniqueId& id, int nranks, int rank, int device, nccl_options opts = {})
      : rank_(rank), size_(nranks), device_(device), opts_(opts) {
    ZSHARD_REQUIRE(nranks >= 1, error_kind::usage, "nccl_comm: nranks must be at least 1, got " + std::to_string(nranks));
    ZSHARD_REQUIRE(rank >= 0 && rank < nranks, error_kind::usage,
            "nccl_comm: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(nranks) + ")");
    try {
      make_resources();
      ncclConfig_t config = nccl_detail::nonblocking_config();
      const std::string what = "ncclCommInitRankConfig(nranks=" + std::to_string(nranks) +
                               ", rank=" + std::to_string(rank) + ", device=" + std::to_string(device) + ")";
      const ncclResult_t r = ncclCommInitRankConfig(&comm_, nranks, id, rank, &config);
      if (r != ncclSuccess && r != ncclInProgress) fail(what, r);
      settle(what);
    } catch (...) {
      release(/*graceful=*/false);
      throw;
    }
  }

  // All ranks of a single-process multi-GPU world, rank i on devices[i] (grouped
  // ncclCommInitRankConfig, the non-blocking form of ncclCommInitAll). Use each from its own thread.
  static std::vector<nccl_comm> create_local(std::span<const int> devices, nccl_options opts = {}) {
    const int n = static_cast<int>(devices.size());
    ZSHARD_REQUIRE(n >= 1, error_kind::usage, "nccl_comm::create_local needs at least one device");
    const cuda::device_restorer restore;  // the caller's current device is current again on return
    const ncclUniqueId id = make_unique_id();
    std::vector<nccl_comm> comms;
    comms.reserve(devices.size());
    for (int r = 0; r < n; ++r) comms.push_back(nccl_comm(adopt{}, r, n, devices[static_cast<std::size_t>(r)], opts));
    ncclConfig_t config = nccl_detail::nonblocking_config();
    const std::string what = "ncclCommInitRankConfig (create_local, " + std::to_string(n) + " devices)";
    try {
      ncclResult_t r = ncclGroupStart();
      for (int q = 0; q < n && (r == ncclSuccess || r == ncclInProgress); ++q) {
        auto& c = comms[static_cast<std::size_t>(q)];
        r = cudaSetDevice(c.device_) == cudaSuccess ? ncclCommInitRankConfig(&c.comm_, n, id, q, &config)
                                                    : ncclUnhandledCudaError;
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after an error
      if (r == ncclSuccess || r == ncclInProgress) r = end;
      if (r != ncclSuccess && r != ncclInProgress) comms.front().fail(what, r);
      for (auto& c : comms) c.settle(what);
    } catch (...) {
      for (auto& c : comms) c.abort("create_local failed");  // finalising would wait for the failed ranks
      throw;
    }
    return comms;
  }

  nccl_comm(nccl_comm&& o) noexcept { take(o); }
  nccl_comm& operator=(nccl_comm&& o) noexcept {
    if (this != &o) {
      release(!aborted_);
      take(o);
    }
    return *this;
  }
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;
  // Flushes and finalises (bounded by the timeout); aborts instead when the communicator has
  // failed or a peer was cancelled, because finalising then waits for ranks that are gone.
  // Several ranks driven from one thread: call finalize_all() on them first.
  ~nccl_comm() { release(!aborted_ && !cancelled() && std::uncaught_exceptions() == 0); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  ncclComm_t handle() const noexcept { return comm_; }
  const nccl_options& options() const noexcept { return opts_; }
  void set_completion(nccl_completion c) noexcept { opts_.completion = c; }
  bool aborted() const noexcept { return aborted_; }
  // True when a wait ended because a peer failed (options().cancel), not through this rank's fault.
  bool stopped_by_peer() const noexcept { return stopped_by_peer_; }

  // The stream a collective given `s` runs on: s itself, or the communicator's own stream when
  // s names none. s must belong to device(); the caller orders other streams with events.
  cudaStream_t stream_of(comm_stream s) const noexcept { return s ? s.as<cudaStream_t>() : own_stream_; }

  // ---- collectives (layout and in-place rules: communicator.hpp) -----------------------------
  void all_gather(const void* src, void* dst, std::size_t count, dtype t, comm_stream s = {}) {
    const std::size_t block = count * size_of(t);
    check_pointers("all_gather", src, dst, count);
    if (nccl_detail::overlaps(src, block, dst, block * static_cast<std::size_t>(size_)) &&
        src != static_cast<const std::byte*>(dst) + block * static_cast<std::size_t>(rank_))
      throw error(error_kind::usage, "all_gather: src overlaps dst other than as dst + rank() * count (in place)");
    if (count == 0) return;
    enqueued(nccl_detail::describe("ncclAllGather", count, t),
             ncclAllGather(src, dst, count, nccl_detail::type_of(t), comm_, stream_of(s)), stream_of(s));
  }

  // op: sum or average (ncclAvg).
  void reduce_scatter(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream s = {}) {
    ZSHARD_REQUIRE(op != reduce_op::max, error_kind::usage, "reduce_scatter supports sum and average, not max",
            "use all_reduce with reduce_op::max");
    const std::size_t block = count * size_of(t);
    check_pointers("reduce_scatter", src, dst, count);
    if (nccl_detail::overlaps(src, block * static_cast<std::size_t>(size_), dst, block) &&
        dst != static_cast<const std::byte*>(src) + block * static_cast<std::size_t>(rank_))
      throw error(error_kind::usage, "reduce_scatter: dst overlaps src other than as src + rank() * count (in place)");
    if (count == 0) return;
    enqueued(nccl_detail::describe("ncclReduceScatter", count, t, op),
             ncclReduceScatter(src, dst, count, nccl_detail::type_of(t), nccl_detail::op_of(op), comm_, stream_of(s)),
             stream_of(s));
  }

  void all_reduce(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream s = {}) {
    const std::size_t bytes = count * size_of(t);
    check_pointers("all_reduce", src, dst, count);
    if (src != dst && nccl_detail::overlaps(src, bytes, dst, bytes))
      throw error(error_kind::usage, "all_reduce: src and dst overlap without being equal");
    if (count == 0) return;
    enqueued(nccl_detail::describe("ncclAllReduce", count, t, op),
             ncclAllReduce(src, dst, count, nccl_detail::type_of(t), nccl_detail::op_of(op), comm_, stream_of(s)),
             stream_of(s));
  }

  void broadcast(void* dst, std::size_t count, dtype t, int root, comm_stream s = {}) {
    ZSHARD_REQUIRE(root >= 0 && root < size_, error_kind::usage,
            "broadcast: root " + std::to_string(root) + " is outside a world of size " + std::to_string(size_));
    check_pointers("broadcast", dst, dst, count);
    if (count == 0) return;
    enqueued(nccl_detail::describe("ncclBroadcast", count, t) + " root=" + std::to_string(root),
             ncclBroadcast(dst, dst, count, nccl_detail::type_of(t), root, comm_, stream_of(s)), stream_of(s));
  }

  // Every rank has reached this point and all work before it on stream_of(s) has finished.
  void barrier(comm_stream s = {}) {
    ZSHARD_REQUIRE(group_depth_ == 0, error_kind::usage, "barrier() inside a group_start()/group_end() pair");
    check_pointers("barrier", scratch_, scratch_, 1);
    enqueued_nowait("ncclAllReduce (barrier)",
                    ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_of(s)));
    wait_stream("barrier", stream_of(s));
  }

  // Waits until everything enqueued on stream_of(s) has finished (with timeout and error checks).
  void synchronize(comm_stream s = {}) { wait_stream("synchronize", stream_of(s)); }

  // Throws error_kind::comm (and aborts) when the communicator has failed: aborted earlier, an
  // asynchronous NCCL error, or a peer cancelled (options().cancel). Never blocks: what other
  // host waits run between polls (cuda_backend::watch(), registered by the engine). Call it
  // from the thread that uses the communicator.
  void poll_health(const std::string& what = "waiting on the host") {
    check_usable(what);
    check_async(what);
    if (cancelled()) {
      stopped_by_peer_ = true;
      fail_waiting(what, "aborted because a peer rank failed", "the first failure is the root cause: fix that one");
    }
  }

  // Test seam: the next polls see `r` as NCCL's asynchronous error, as if the network or a
  // peer had failed. Lets GPU tests prove that every host wait stops on an NCCL error.
  void inject_async_error_for_testing(ncclResult_t r) noexcept { injected_ = r; }

  // Collectives between group_start() and group_end() are launched together (one NCCL launch
  // for several tensors); they complete, or are waited for, at group_end(). Nestable.
  void group_start() {
    check_usable("group_start");
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) fail("ncclGroupStart", r);
    ++group_depth_;
  }
  void group_end() {
    ZSHARD_REQUIRE(group_depth_ > 0, error_kind::usage, "group_end() without group_start()");
    --group_depth_;
    enqueued_nowait("ncclGroupEnd", ncclGroupEnd());
    if (group_depth_ > 0) return;
    // The group's collectives may run on several streams: wait for each of them.
    const auto streams = std::exchange(group_streams_, {});
    if (opts_.completion == nccl_completion::wait)
      for (cudaStream_t on : streams) wait_stream("ncclGroupEnd", on);
  }

  // The sub-communicator of the ranks that pass the same color (>= 0), ordered by (key, rank),
  // on the same device with the same options (ncclCommSplit, non-blocking, so a rank that
  // never calls it makes the others time out). A collective: every rank calls it.
  nccl_comm split(int color, int key) {
    check_usable("split");
    ZSHARD_REQUIRE(group_depth_ == 0, error_kind::usage, "split() inside a group_start()/group_end() pair");
    ZSHARD_REQUIRE(color >= 0, error_kind::usage, "split: color " + std::to_string(color) + " must be >= 0",
                   "give every rank a group (color); a rank that wants no group can use a group of its own");
    nccl_comm out(adopt{}, 0, 1, device_, opts_);
    ncclConfig_t config = nccl_detail::nonblocking_config();
    const std::string what = "ncclCommSplit(color=" + std::to_string(color) + ", key=" + std::to_string(key) + ")";
    try {
      const ncclResult_t r = ncclCommSplit(comm_, color, key, &out.comm_, &config);
      if (r != ncclSuccess && r != ncclInProgress) fail(what, r);
      settle(what);
      out.settle(what);
      int n = 0, me = 0;
      if (const ncclResult_t c = ncclCommCount(out.comm_, &n); c != ncclSuccess) out.fail("ncclCommCount", c);
      if (const ncclResult_t u = ncclCommUserRank(out.comm_, &me); u != ncclSuccess) out.fail("ncclCommUserRank", u);
      out.rank_ = me;
      out.size_ = n;
    } catch (...) {
      out.abort("split failed");
      throw;
    }
    return out;
  }

  // Flushes and destroys several communicators together, since finalising one rank may wait
  // for its peers (one thread finalising them one by one would wait on itself). A communicator
  // that does not finish within its timeout, or fails, is aborted instead. Idempotent.
  // The caller's current device is restored.
  static void finalize_all(std::span<nccl_comm> comms) noexcept {
    const cuda::device_restorer restore;
    std::vector<int> state(comms.size(), 0);  // 0 pending, 1 finalised, -1 abort
    for (std::size_t i = 0; i < comms.size(); ++i) {
      nccl_comm& c = comms[i];
      if (!c.comm_ || c.aborted_) continue;
      (void)cudaSetDevice(c.device_);
      const ncclResult_t r = ncclCommFinalize(c.comm_);
      state[i] = r == ncclSuccess ? 1 : r == ncclInProgress ? 0 : -1;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      bool pending = false;
      for (std::size_t i = 0; i < comms.size(); ++i) {
        nccl_comm& c = comms[i];
        if (!c.comm_ || c.aborted_ || state[i] != 0) continue;
        ncclResult_t st = ncclInProgress;
        if (ncclCommGetAsyncError(c.comm_, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress) ||
            c.cancelled())  // a peer failed: finalising would wait for it
          state[i] = -1;
        else if (st == ncclSuccess)
          state[i] = 1;
        else if (std::chrono::steady_clock::now() - start > c.opts_.timeout)
          state[i] = -1;
        else
          pending = true;
      }
      if (!pending) break;
      nccl_detail::back_off(spins);
    }
    for (std::size_t i = 0; i < comms.size(); ++i) {
      nccl_comm& c = comms[i];
      if (!c.comm_) continue;
      if (state[i] == 1 && !c.aborted_) {
        (void)ncclCommDestroy(c.comm_);
        c.comm_ = nullptr;
      } else {
        c.abort_now();
      }
    }
  }

  // Aborts the communicator now (idempotent); later collectives throw error_kind::comm.
  void abort(const std::string& reason = "aborted by the caller") noexcept {
    if (!aborted_) reason_ = reason;
    abort_now();
  }

 private:

  struct adopt {};
  nccl_comm(adopt, int rank, int nranks, int device, nccl_options opts)
      : rank_(rank), size_(nranks), device_(device), opts_(opts) {
    make_resources();
  }

  // The communicator's own stream and the one float the barrier reduces.
  void make_resources() {
    cuda::check(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
    ZSHARD_CUDA_CHECK(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking));
    void* p = nullptr;
    ZSHARD_CUDA_CHECK(cudaMalloc(&p, sizeof(float)));
    scratch_ = static_cast<float*>(p);
  }

  void take(nccl_comm& o) noexcept {
    comm_ = std::exchange(o.comm_, nullptr);
    own_stream_ = std::exchange(o.own_stream_, nullptr);
    group_streams_ = std::exchange(o.group_streams_, {});
    scratch_ = std::exchange(o.scratch_, nullptr);
    rank_ = o.rank_;
    size_ = o.size_;
    device_ = o.device_;
    opts_ = o.opts_;
    group_depth_ = std::exchange(o.group_depth_, 0);
    aborted_ = std::exchange(o.aborted_, false);
    reason_ = std::move(o.reason_);
    injected_ = std::exchange(o.injected_, ncclSuccess);
    stopped_by_peer_ = std::exchange(o.stopped_by_peer_, false);
  }

  void release(bool graceful) noexcept {
    if (comm_) {
      if (graceful) finalize_all(std::span<nccl_comm>(this, 1));
      else abort_now();
    }
    if (scratch_) (void)cudaFree(scratch_);
    if (own_stream_) (void)cudaStreamDestroy(own_stream_);
    scratch_ = nullptr;
    own_stream_ = nullptr;
  }

  bool cancelled() const noexcept { return opts_.cancel && opts_.cancel->load(std::memory_order_relaxed); }

  void abort_now() noexcept {
    if (opts_.report_failure) opts_.report_failure->store(true);
    aborted_ = true;
    if (comm_) (void)ncclCommAbort(comm_);  // also makes NCCL kernels in flight return
    comm_ = nullptr;
  }

  std::string where() const {
    return " on rank " + std::to_string(rank_) + " (device " + std::to_string(device_) + ")";
  }

  void check_usable(const std::string& what) const {
    if (aborted_ || !comm_)
      throw error(error_kind::comm, what + where() + ": the communicator was aborted earlier: " + reason_,
                  "the first error is the root cause; create a new communicator to continue");
  }
  void check_pointers(const char* what, const void* src, const void* dst, std::size_t count) const {
    check_usable(what);
    if (count != 0 && (src == nullptr || dst == nullptr))
      throw error(error_kind::usage, std::string(what) + where() + ": null buffer with count " + std::to_string(count));
  }

  [[noreturn]] void fail(const std::string& what, ncclResult_t r) {
    std::string detail = ncclGetErrorString(r);
    if (const char* last = ncclGetLastError(comm_); last && *last) detail += ": " + std::string(last);
    reason_ = what + " failed: " + detail;
    abort_now();
    throw error(error_kind::comm, what + where() + " failed: " + detail,
                r == ncclInvalidUsage || r == ncclInvalidArgument
                    ? "check that every rank calls the same collectives with the same count, dtype and op"
                    : "a peer rank may have failed or the network dropped; the communicator was aborted");
  }

  [[noreturn]] void fail_waiting(const std::string& what, const std::string& why, const char* hint) {
    reason_ = what + ": " + why;
    abort_now();
    throw error(error_kind::comm, what + where() + ": " + why, hint);
  }

  // Times out or honours a cancellation while waiting on `what`.
  void check_deadline(const std::string& what, std::chrono::steady_clock::time_point start) {
    if (cancelled()) stopped_by_peer_ = true;
    if (cancelled())
      fail_waiting(what, "aborted because a peer rank failed", "the first failure is the root cause: fix that one");
    if (std::chrono::steady_clock::now() - start > opts_.timeout)
      fail_waiting(what, "did not complete within " + std::to_string(opts_.timeout.count()) +
                             " ms; the communicator was aborted",
                   "every rank must call the same collectives in the same order; a rank that failed, skipped one "
                   "or hangs stops the others. Raise nccl_options::timeout only if ranks are legitimately slow");
  }

  // A non-blocking communicator's call may return ncclInProgress: wait until its state leaves
  // it (NCCL requires that before the next call), failing on an error or the timeout.
  void settle(const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) fail(what + " (ncclCommGetAsyncError)", r);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, state);
      check_deadline(what, start);
      nccl_detail::back_off(spins);
    }
  }

  void enqueued_nowait(const std::string& what, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) fail(what, r);
    if (group_depth_ == 0) settle(what);
  }
  void enqueued(const std::string& what, ncclResult_t r, cudaStream_t on) {
    enqueued_nowait(what, r);
    if (group_depth_ > 0) {
      if (std::find(group_streams_.begin(), group_streams_.end(), on) == group_streams_.end())
        group_streams_.push_back(on);
    } else if (opts_.completion == nccl_completion::wait) {
      wait_stream(what, on);
    }
  }

  void wait_stream(const std::string& what, cudaStream_t on) {
    check_usable(what);
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaStreamQuery(on);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        reason_ = what + ": cudaStreamQuery failed: " + cuda::describe(q);
        abort_now();
        throw cuda::make_error(q, "cudaStreamQuery (waiting for " + what + where() + ")");
      }
      check_async(what);
      check_deadline(what, start);
      nccl_detail::back_off(spins);
    }
  }

  // Fails (aborting) on an asynchronous NCCL error, a real one or one injected for a test.
  void check_async(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(what + " (ncclCommGetAsyncError)", r);
    if (injected_ != ncclSuccess) state = injected_;
    if (state != ncclSuccess && state != ncclInProgress) fail(what, state);
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t own_stream_ = nullptr;
  std::vector<cudaStream_t> group_streams_;  // streams the open group's collectives run on
  float* scratch_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  nccl_options opts_{};
  int group_depth_ = 0;
  bool aborted_ = false;
  std::string reason_;
  ncclResult_t injected_ = ncclSuccess;  // inject_async_error_for_testing
  bool stopped_by_peer_ = false;
};

static_assert(check_communicator<nccl_comm>());

}  // namespace zshard

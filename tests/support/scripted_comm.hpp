#pragma once
// A communicator wrapper for failure-path tests: counts every collective by kind, fails a
// chosen call of a chosen kind, reports a fake asynchronous error through poll_health() (the
// NCCL-style health check the engine registers in a backend's wait_watch), and records
// abort(). Every rank of a test runs the same script, so the ranks fail together and nothing
// waits for a peer that is gone.
//
// How a call fails, as NCCL's do: an all-gather fails before anything is enqueued (NCCL
// rejects a collective it cannot launch, and inside a group nothing of it runs); a
// reduce-scatter or all-reduce fails after the inner collective ran on its stream (an
// enqueued collective whose failure is reported afterwards), so its buffers were in use there.
#include <array>
#include <cstddef>
#include <string>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/error.hpp"

namespace test_support {

enum class collective : std::size_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, count };

template <class Comm>
class scripted_comm {
 public:
  using zshard_tag = zshard::communicator_tag;

  explicit scripted_comm(Comm& inner) : inner_(&inner) {}

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }

  // The n-th call of `kind` from now on (1 = the next one) throws error_kind::comm.
  void fail_call(collective kind, std::size_t n) {
    fail_kind_ = kind;
    fail_at_ = calls(kind) + n;
  }
  // From now on poll_health() throws, as nccl_comm does on an NCCL asynchronous error.
  void fail_health(std::string why) { health_error_ = std::move(why); }

  std::size_t calls(collective kind) const noexcept { return calls_[static_cast<std::size_t>(kind)]; }
  std::size_t health_polls() const noexcept { return health_polls_; }
  const std::string& abort_reason() const noexcept { return abort_reason_; }
  // The buffer of the call that failed as scripted: an all-gather's destination, a reduction's
  // source (null: none failed). Tests check that no parameter still holds it.
  const void* failed_buffer() const noexcept { return failed_; }

  void all_gather(const void* src, void* dst, std::size_t count, zshard::dtype t, zshard::comm_stream s = {}) {
    count_call(collective::all_gather, dst, /*before=*/true);
    inner_->all_gather(src, dst, count, t, s);
  }
  void reduce_scatter(const void* src, void* dst, std::size_t count, zshard::dtype t, zshard::reduce_op op,
                      zshard::comm_stream s = {}) {
    inner_->reduce_scatter(src, dst, count, t, op, s);
    count_call(collective::reduce_scatter, src, /*before=*/false);
  }
  void all_reduce(const void* src, void* dst, std::size_t count, zshard::dtype t, zshard::reduce_op op,
                  zshard::comm_stream s = {}) {
    inner_->all_reduce(src, dst, count, t, op, s);
    count_call(collective::all_reduce, src, /*before=*/false);
  }
  void broadcast(void* dst, std::size_t count, zshard::dtype t, int root, zshard::comm_stream s = {}) {
    count_call(collective::broadcast, nullptr, true);
    inner_->broadcast(dst, count, t, root, s);
  }
  void barrier(zshard::comm_stream s = {}) {
    count_call(collective::barrier, nullptr, true);
    inner_->barrier(s);
  }
  void group_start() {
    if constexpr (zshard::groupable<Comm>) inner_->group_start();
  }
  void group_end() {
    if constexpr (zshard::groupable<Comm>) inner_->group_end();
  }

  void poll_health() {
    ++health_polls_;
    if (!health_error_.empty())
      throw zshard::error(zshard::error_kind::comm, "fake NCCL asynchronous error: " + health_error_);
  }
  void abort(const std::string& reason) {
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted" : reason;
  }

 private:
  // Counts a call of `kind` that uses `buffer` (its destination or source), and fails it when
  // scripted to.
  void count_call(collective kind, const void* buffer, bool before) {
    const std::size_t n = ++calls_[static_cast<std::size_t>(kind)];
    if (kind == fail_kind_ && n == fail_at_) {
      failed_ = buffer;
      throw zshard::error(zshard::error_kind::comm, std::string("scripted failure of call #") + std::to_string(n) +
                                                        (before ? " (before it was enqueued)" : " (after it ran)"));
    }
  }

  Comm* inner_;
  std::array<std::size_t, static_cast<std::size_t>(collective::count)> calls_{};
  collective fail_kind_ = collective::count;
  std::size_t fail_at_ = 0;
  std::string health_error_;
  std::size_t health_polls_ = 0;
  std::string abort_reason_;
  const void* failed_ = nullptr;
};

}  // namespace test_support

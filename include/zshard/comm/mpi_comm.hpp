#pragma once
// The MPI communicator: the communicator concept over MPI, one rank per process (or per node,
// or per GPU with the host backend), on host memory. Launched by mpirun/mpiexec or Slurm;
// comm/mpi_run.hpp has the session and the run_mpi() entry point that ends the job on failure.
//
// Results are bitwise those of thread_comm at the same world size: MPI only moves bytes here,
// it never reduces. all_gather and reduce_scatter are direct messages to every peer
// (mpi_exchange.hpp: faster than Open MPI's non-blocking collectives); reduce_scatter then
// reduces with the thread communicator's kernel (detail::reduce_block: f32 accumulation in rank
// order 0..n-1, one division for average, one rounding to bf16/f16); all_reduce is the same on
// an even split of the elements (MPI_Ialltoallv) followed by an all-gather of the reduced
// slices. MPI_Reduce_scatter would not do: MPI may reduce in any order (and has no bf16/f16
// types), so results would depend on the implementation and the world size. The bytes each
// rank sends are those of a ring collective, (n - 1) / n of the buffer.
//
// Same timeout and failure semantics as thread_comm (communicator.hpp, "Failure"):
// - Every MPI call is non-blocking (MPI_Isend/Irecv, MPI_Ialltoallv, MPI_Iallgatherv,
//   MPI_Ibcast, MPI_Ibarrier, MPI_Comm_idup) and polled with MPI_Testall against
//   options().timeout (default_comm_timeout, as thread_comm): never a silent hang.
// - Each collective's arguments (kind, sequence number, count, dtype, op, root) reach every
//   peer in its first message: ranks that call different collectives, skip one or disagree on a
//   count fail with the same "collective mismatch" message thread_comm gives, on every rank,
//   before any of the collective's data reaches the caller's buffers. all_gather and
//   reduce_scatter carry them in their own messages; the others spend one small round on them
//   (check_arguments, the default).
// - A rank that ends its run (finish(), called by run_mpi) tells its peers how many collectives
//   it took part in, on this communicator and on every one split from it; a peer waiting in a
//   later collective fails at once, naming it, in a split's group too (mpi_control.hpp).
// - A rank that times out asks its peers which collective they are in: the message names the
//   ranks that do not answer (hung, busy, dead), those in another collective, those waiting too.
// - A failure throws error_kind::comm naming the collective, its number and the ranks; the
//   communicator is then unusable (an MPI request may still reference the caller's buffers),
//   and the process must end: run_mpi() calls MPI_Abort, which ends every process of the job.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/comm/mpi_control.hpp"
#include "zshard/comm/mpi_exchange.hpp"
#include "zshard/comm/mpi_options.hpp"
#include "zshard/comm/thread_comm.hpp"  // the shared reduction kernel, argument checks and default timeout

namespace zshard {

class mpi_comm {
 public:
  using zshard_tag = communicator_tag;

  // Every rank of `base` constructs one (it is a collective over base): duplicates base for
  // the collectives and again for the control messages, so user traffic on base never mixes
  // with ours. MPI must be initialised (mpi_session or MPI_Init_thread).
  explicit mpi_comm(MPI_Comm base = MPI_COMM_WORLD, mpi_options opts = {})
      : opts_(opts), spin_(mpi_detail::spin_for_node(opts.spin)) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    ZSHARD_REQUIRE(init && !fin, error_kind::usage, "mpi_comm: MPI is not initialised (or already finalised)",
                   "create a zshard::mpi_session (or call MPI_Init_thread) before any mpi_comm; see comm/mpi_run.hpp");
    mpi_detail::check_options(opts);
    ZSHARD_REQUIRE(base != MPI_COMM_NULL, error_kind::usage, "mpi_comm: base communicator is MPI_COMM_NULL");
    MPI_Comm_rank(base, &rank_);
    MPI_Comm_size(base, &size_);
    phase_ = "mpi_comm construction (MPI_Comm_idup)";
    MPI_Comm dups[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
    for (MPI_Comm& c : dups) {
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Comm_idup(base, &c, &req));
      wait(req);
      check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    }
    data_ = dups[0];
    ctrl_ = dups[1];
    own_ = std::make_shared<mpi_detail::lineage>();
    own_->ctrl = ctrl_;
    own_->peer_done.assign(static_cast<std::size_t>(size_), -1);
    root_ = own_;
    check_options_agree();
  }

  mpi_comm(mpi_comm&& o) noexcept { take(o); }
  mpi_comm& operator=(mpi_comm&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  mpi_comm(const mpi_comm&) = delete;
  mpi_comm& operator=(const mpi_comm&) = delete;
  ~mpi_comm() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm handle() const noexcept { return data_; }
  const mpi_options& options() const noexcept { return opts_; }
  bool failed() const noexcept { return !failed_.empty(); }
  std::uint64_t collectives_called() const noexcept { return seq_; }

  void all_gather(const void* src, void* dst, std::size_t count, dtype t, comm_stream = {}) {
    const std::size_t block = count * size_of(t);
    check_pointers("all_gather", src, dst, count);
    const bool in_place = src == static_cast<const std::byte*>(dst) + block * static_cast<std::size_t>(rank_);
    if (detail::overlaps(src, block, dst, block * static_cast<std::size_t>(size_)) && !in_place)
      throw error(error_kind::usage, "all_gather: src overlaps dst other than as dst + rank() * count (in place)");
    as_int(count);
    number(detail::collective::all_gather, count, t, reduce_op::sum, 0);
    auto* out = static_cast<std::byte*>(dst);
    // Every peer gets this rank's block; peer q's block lands at out + q * block.
    exchange_blocks(
        block, count, t, [&](int) { return static_cast<const std::byte*>(src); },
        [&](int q) { return out + static_cast<std::size_t>(q) * block; },
        [&] {
          if (!in_place && block != 0) std::memcpy(out + static_cast<std::size_t>(rank_) * block, src, block);
        });
  }

  // op: sum or average. Rank-order f32 reduction of the exchanged blocks (see above).
  void reduce_scatter(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream = {}) {
    ZSHARD_REQUIRE(op != reduce_op::max, error_kind::usage, "reduce_scatter supports sum and average, not max",
                   "use all_reduce with reduce_op::max");
    const std::size_t block = count * size_of(t);
    check_pointers("reduce_scatter", src, dst, count);
    if (detail::overlaps(src, block * static_cast<std::size_t>(size_), dst, block) &&
        dst != static_cast<const std::byte*>(src) + block * static_cast<std::size_t>(rank_))
      throw error(error_kind::usage, "reduce_scatter: dst overlaps src other than as src + rank() * count (in place)");
    as_int(count);
    number(detail::collective::reduce_scatter, count, t, op, 0);
    const auto* in = static_cast<const std::byte*>(src);
    staging_.resize(block * static_cast<std::size_t>(size_));
    std::byte* staged = staging_.data();
    // Peer q gets block q of src; block r of every rank is staged at q * block, in rank order.
    exchange_blocks(
        block, count, t, [&](int q) { return in + static_cast<std::size_t>(q) * block; },
        [&](int q) { return staged + static_cast<std::size_t>(q) * block; },
        [&] {
          const std::size_t mine = static_cast<std::size_t>(rank_) * block;
          if (block != 0) std::memcpy(staged + mine, in + mine, block);
        });
    if (count != 0) mpi_detail::reduce_staged(staged, size_, t, count, count, op, dst);
  }

  // src == dst is allowed. Rank r reduces slice r of an even split (thread_comm's split_range)
  // and the slices are all-gathered back.
  void all_reduce(const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream = {}) {
    const std::size_t bytes = count * size_of(t);
    check_pointers("all_reduce", src, dst, count);
    if (src != dst && detail::overlaps(src, bytes, dst, bytes))
      throw error(error_kind::usage, "all_reduce: src and dst overlap without being equal");
    if (!begin(detail::collective::all_reduce, count, t, op, 0)) return;
    as_int(count);
    const auto [lens, offs, mine_lens, mine_offs] = mpi_detail::even_split_layout(count, size_, rank_);
    const int my_len = lens[static_cast<std::size_t>(rank_)];
    const auto un = static_cast<std::size_t>(size_);
    const MPI_Datatype mt = mpi_detail::type_of(t);
    const std::size_t es = size_of(t), my_bytes = static_cast<std::size_t>(my_len) * es;
    staging_.resize(my_bytes * (un + 1));  // every rank's slice r, then the reduced slice
    std::byte* reduced = staging_.data() + my_bytes * un;
    run(MPI_Ialltoallv(src, lens.data(), offs.data(), mt, staging_.data(), mine_lens.data(), mine_offs.data(), mt,
                       data_, &req_));
    mpi_detail::reduce_staged(staging_.data(), size_, t, static_cast<std::size_t>(my_len),
                              static_cast<std::size_t>(my_len), op, reduced);
    run(MPI_Iallgatherv(reduced, my_len, mt, dst, lens.data(), offs.data(), mt, data_, &req_));
  }

  void broadcast(void* dst, std::size_t count, dtype t, int root, comm_stream = {}) {
    ZSHARD_REQUIRE(root >= 0 && root < size_, error_kind::usage,
                   "broadcast: root " + std::to_string(root) + " is outside a world of size " + std::to_string(size_));
    check_pointers("broadcast", dst, dst, count);
    if (!begin(detail::collective::broadcast, count, t, reduce_op::sum, root)) return;
    run(MPI_Ibcast(dst, as_int(count), mpi_detail::type_of(t), root, data_, &req_));
  }

  void barrier(comm_stream = {}) { begin(detail::collective::barrier, 0, dtype::f32, reduce_op::sum, 0); }

  // The sub-communicator of the ranks that pass the same color, ordered by (key, rank), as
  // MPI_Comm_split. A collective: every rank calls it (color >= 0). The (color, key) pairs are
  // all-gathered first through the checked path, so a rank that does not call split fails it
  // within the timeout instead of blocking in MPI_Comm_split.
  mpi_comm split(int color, int key) {
    const std::int32_t mine[2] = {color, key};
    std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size_));
    all_gather(mine, all.data(), 2, dtype::f32);  // two int32 as two f32 words: a copy
    for (int q = 0; q < size_; ++q)
      ZSHARD_REQUIRE(all[2 * static_cast<std::size_t>(q)] >= 0, error_kind::usage,
                     "split: rank " + std::to_string(q) + " passed color " +
                         std::to_string(all[2 * static_cast<std::size_t>(q)]) + "; colors must be >= 0",
                     "give every rank a group (color); a rank that wants no group can use a group of its own");
    const std::uint64_t split_seq = slot_.seq;  // the all_gather's number: the same on every rank
    MPI_Comm sub = MPI_COMM_NULL;
    phase_ = "split (MPI_Comm_split)";
    check(MPI_Comm_split(data_, color, key, &sub));  // every rank is known to be here
    try {
      mpi_comm out(sub, opts_);
      MPI_Comm_free(&sub);
      out.root_rank_ = mpi_detail::members_by_root_rank(all, color, root_rank_);
      out.root_ = root_;
      out.group_id_ = mpi_detail::group_id(group_id_, split_seq, color);
      root_->my_groups[out.group_id_] = 0;
      return out;
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
  }

  // Every rank's node, named by the lowest rank on it (MPI_COMM_TYPE_SHARED: the processes that
  // can share memory). A collective, for hybrid sharding's node rule (partition/hybrid_layout.hpp).
  // A barrier through the checked path first, so a rank that does not call it fails within the
  // timeout instead of blocking in MPI_Comm_split_type.
  std::vector<int> node_ids() {
    barrier();
    MPI_Comm shared = MPI_COMM_NULL;
    phase_ = "node_ids (MPI_Comm_split_type)";
    check(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared));
    std::int32_t first = rank_;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT32_T, MPI_MIN, shared);
    MPI_Comm_free(&shared);
    check(rc);
    std::vector<std::int32_t> all(static_cast<std::size_t>(size_));
    all_gather(&first, all.data(), 1, dtype::f32);  // an int32 as an f32 word: a copy
    return std::vector<int>(all.begin(), all.end());
  }

  // Ends this rank's run: tells every peer how many collectives it called, then waits (up to
  // the timeout) for theirs and checks they agree. A peer still waiting in a collective this
  // rank never called fails at once, naming this rank. run_mpi() calls it; idempotent.
  void finish() {
    if (finished_) return;
    check_usable("finish");
    finished_ = true;
    phase_ = "finish (end-of-run handshake)";
    const auto un = static_cast<std::size_t>(size_);
    std::vector<MPI_Request> sends(un, MPI_REQUEST_NULL);
    const std::uint64_t mine = seq_;
    const std::vector<std::uint64_t> notice = mpi_detail::done_notice(*own_, mine);  // and its groups' counts
    for (int q = 0; q < size_; ++q)
      if (q != rank_)
        check(MPI_Isend(notice.data(), static_cast<int>(notice.size()), MPI_UINT64_T, q, mpi_detail::done_tag, ctrl_,
                        &sends[static_cast<std::size_t>(q)]));
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int sent = 0;
      check(MPI_Testall(size_, sends.data(), &sent, MPI_STATUSES_IGNORE));
      poll_notices(/*waiting_seq=*/std::numeric_limits<std::uint64_t>::max());
      std::string missing;
      for (int q = 0; q < size_; ++q) {
        const std::int64_t d = own_->peer_done[static_cast<std::size_t>(q)];
        if (q == rank_) continue;
        if (d < 0)
          missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        else if (static_cast<std::uint64_t>(d) != mine)
          fail("finish on rank " + std::to_string(rank_) + ": rank " + std::to_string(q) + " returned after " +
                   std::to_string(d) + " collectives, this rank after " + std::to_string(mine),
               "every rank must call the same collectives; one skipped or added some");
      }
      if (missing.empty() && sent) return;
      if (std::chrono::steady_clock::now() - start > opts_.timeout)
        fail("finish on rank " + std::to_string(rank_) + " timed out after " + std::to_string(opts_.timeout.count()) +
                 " ms waiting for rank(s) " + (missing.empty() ? std::string("(sends pending)") : missing) +
                 " to finish",
             "a rank that is still training, or hangs, keeps the others from ending");
      mpi_detail::back_off(std::chrono::steady_clock::now() - start, spin_);
    }
  }

 private:
  static int as_int(std::size_t count) {
    ZSHARD_REQUIRE(count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), error_kind::usage,
                   "mpi_comm: count " + std::to_string(count) + " exceeds MPI's int counts",
                   "split the collective into pieces of at most 2^31 - 1 elements");
    return static_cast<int>(count);
  }

  // The options that shape messages must agree: a first message longer than its slot (inline_bytes)
  // would be written past it (mpi_exchange.hpp), a rank skipping the argument round
  // (check_arguments) would leave its peers waiting. Else a usage error on every rank.
  void check_options_agree() {
    mpi_detail::shaping_options most(opts_);
    phase_ = "mpi_comm construction (comparing options)";
    check(MPI_Iallreduce(MPI_IN_PLACE, most.values, 4, MPI_INT64_T, MPI_MAX, data_, &req_));
    wait(req_);
    phase_ = nullptr;
    const std::string differ = most.disagreement();
    if (differ.empty()) return;
    release();  // no destructor runs for a constructor that throws
    throw error(error_kind::usage, "mpi_comm: the ranks passed different mpi_options: " + differ,
                "pass every rank the same mpi_options (timeout and spin may differ)");
  }

  void check_usable(const char* what) const {
    if (!failed_.empty())
      throw error(
          error_kind::comm,
          std::string(what) + " on rank " + std::to_string(rank_) + ": the communicator failed earlier: " + failed_,
          "the first failure is the root cause; end the job (run_mpi calls MPI_Abort) and fix that one");
  }
  void check_pointers(const char* what, const void* src, const void* dst, std::size_t count) const {
    check_usable(what);
    if (count != 0 && (src == nullptr || dst == nullptr))
      throw error(error_kind::usage, std::string(what) + " on rank " + std::to_string(rank_) +
                                         ": null buffer with count " + std::to_string(count));
  }

  // Numbers the collective (and names it for messages); no communication.
  void number(detail::collective kind, std::size_t count, dtype t, reduce_op op, int root) {
    check_usable(detail::to_string(kind));
    slot_ = detail::comm_slot{kind, seq_++, nullptr, nullptr, count, t, op, root};
    if (root_ != own_) root_->my_groups[group_id_] = seq_;  // what this rank's end-of-run notice says
    phase_ = nullptr;  // described only when a message needs it: a string per call costs a small one
  }

  // Numbers the collective, checks every rank called the same one (check_arguments) and says
  // whether there is data to move; a count of 0 still synchronises, as on threads.
  bool begin(detail::collective kind, std::size_t count, dtype t, reduce_op op, int root) {
    number(kind, count, t, op, root);
    if (opts_.check_arguments) {
      exchange_.start(data_, rank_, size_, first_message_bytes());
      exchange_.post_first(mpi_detail::header_of(slot_), 0, nullptr, [this](int rc) { check(rc); });
      finish_first_messages();
    } else if (count == 0 || kind == detail::collective::barrier) {
      run(MPI_Ibarrier(data_, &req_));
    }
    return count != 0 && kind != detail::collective::barrier;
  }

  // all_gather's and reduce_scatter's messages (mpi_exchange.hpp): `count` elements (`block` bytes)
  // from send_to(q) to each peer q, from each peer q into receive_at(q); inline in the first message
  // when it fits, else in a data message received once the headers matched. local_copy() overlaps it.
  template <class SendTo, class ReceiveAt, class LocalCopy>
  void exchange_blocks(std::size_t block, std::size_t count, dtype t, SendTo&& send_to, ReceiveAt&& receive_at,
                       LocalCopy&& local_copy) {
    const bool inline_payload = mpi_detail::header_room + block <= first_message_bytes();
    const auto checked = [this](int rc) { check(rc); };
    exchange_.start(data_, rank_, size_, first_message_bytes());
    const int n = static_cast<int>(count);  // checked by the caller (as_int)
    if (!inline_payload) exchange_.post_data_sends(n, mpi_detail::type_of(t), send_to, checked);
    exchange_.post_first(mpi_detail::header_of(slot_), inline_payload ? block : 0, send_to, checked);
    finish_first_messages();
    if (!inline_payload) exchange_.post_data_receives(n, mpi_detail::type_of(t), receive_at, checked);
    local_copy();  // after the check (a mismatch leaves the caller's buffers as they were)
    if (!inline_payload) return wait_all(exchange_.data);
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && block != 0) std::memcpy(receive_at(q), exchange_.payload_from(q), block);
  }

  std::size_t first_message_bytes() const { return std::max(opts_.inline_bytes, mpi_detail::header_room); }

  // Waits for the first messages and fails, on every rank alike, if any rank called another
  // collective or passed other arguments.
  void finish_first_messages() {
    wait_all(exchange_.first);
    exchange_.first.clear();
    const std::string diff = exchange_.mismatch(mpi_detail::header_of(slot_));
    if (!diff.empty())
      fail(std::string(detail::to_string(slot_.kind)) + " on rank " + std::to_string(rank_) +
               ": collective mismatch: " + diff,
           "every rank must call the same collectives in the same order with the same count, dtype, op and root");
  }

  void check(int rc) {
    if (rc != MPI_SUCCESS)
      fail(current() + " on rank " + std::to_string(rank_) + ": " + mpi_detail::error_string(rc),
           "an MPI call failed: a peer process may have died or the network dropped");
  }
  void run(int rc) {
    check(rc);
    wait(req_);
  }
  void wait(MPI_Request& req) { wait_all(std::span<MPI_Request>(&req, 1)); }

  // Polls `requests` to completion, failing on the timeout (mpi_detail::poll_clock: counted from
  // the 16th poll) or when a peer has ended its run without joining this collective.
  void wait_all(std::span<MPI_Request> requests) {
    mpi_detail::poll_clock clock;
    for (int spins = 0;; ++spins) {
      int done = 0;
      check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
      if (done) return;
      if (clock.tick() && clock.waited() > opts_.timeout)
        fail(current() + " on rank " + std::to_string(rank_) + " timed out after " +
                 std::to_string(opts_.timeout.count()) + " ms: " + where_are_peers(),
             "every rank must call the same collectives in the same order; a rank that skipped one, hangs or "
             "died stops the others. Raise mpi_options::timeout only if ranks are legitimately slow");
      // Not on the first spins: a small collective is done by then, and each poll costs it
      // probes of the control channel.
      if (ctrl_ != MPI_COMM_NULL && spins % 64 == 63) poll_notices(slot_.seq);
      if (root_ != own_ && spins % 64 == 63) poll_group_notices();
      mpi_detail::back_off(clock.waited(), spin_);
    }
  }

  // Receives peers' "finished after N collectives" notices; one that finished before the
  // collective this rank waits in (number waiting_seq) will never join it.
  void poll_notices(std::uint64_t waiting_seq) {
    answer_probes();
    check(mpi_detail::receive_done_notices(*own_));
    if (waiting_seq == std::numeric_limits<std::uint64_t>::max()) return;
    for (int q = 0; q < size_; ++q) {
      const std::int64_t d = own_->peer_done[static_cast<std::size_t>(q)];
      if (d >= 0 && static_cast<std::uint64_t>(d) <= waiting_seq)
        fail(current() + " on rank " + std::to_string(rank_) + ": rank " + std::to_string(q) +
                 " returned (ended its run) after " + std::to_string(d) + " collectives without joining this one",
             "every rank must call the same collectives; a rank that returns early stops the others");
    }
  }

  // A split's group: the notices of ranks that ended their run arrive on the root's channel.
  void poll_group_notices() {
    check(mpi_detail::receive_done_notices(*root_));
    const std::string gone = mpi_detail::member_gone(*root_, group_id_, root_rank_, slot_.seq);
    if (!gone.empty())
      fail(current() + " on rank " + std::to_string(rank_) + " of a split group: " + gone,
           "every rank must call the same collectives; a rank that returns early stops the others");
  }

  // Tells a peer that timed out which collective this rank waits in (or that it is finishing).
  void answer_probes() {
    probes_.answer(ctrl_, finished_ ? mpi_detail::finishing : slot_.seq, [this](int rc) { check(rc); });
  }

  // On a timeout: asks every peer where it is and names them (mpi_control.hpp).
  std::string where_are_peers() {
    return probes_.where_are_peers(ctrl_, rank_, size_, slot_.seq, finished_ ? mpi_detail::finishing : slot_.seq,
                                   opts_.timeout, [this](int rc) { check(rc); });
  }

  [[noreturn]] void fail(const std::string& msg, const std::string& hint) {
    if (failed_.empty()) failed_ = msg;
    throw error(error_kind::comm, msg, hint);
  }

  void take(mpi_comm& o) noexcept {
    data_ = std::exchange(o.data_, MPI_COMM_NULL);
    ctrl_ = std::exchange(o.ctrl_, MPI_COMM_NULL);
    req_ = std::exchange(o.req_, MPI_REQUEST_NULL);
    rank_ = o.rank_;
    size_ = o.size_;
    opts_ = o.opts_;
    spin_ = o.spin_;
    seq_ = o.seq_;
    slot_ = o.slot_;
    finished_ = o.finished_;
    failed_ = std::move(o.failed_);
    phase_ = o.phase_;
    own_ = std::move(o.own_);
    root_ = std::move(o.root_);
    group_id_ = o.group_id_;
    root_rank_ = std::move(o.root_rank_);
    staging_ = std::move(o.staging_);
    exchange_ = std::move(o.exchange_);
    probes_ = std::move(o.probes_);
  }
  // A failed communicator may have a request in flight: it is left to the MPI_Abort that follows.
  void release() noexcept {
    int fin = 1;
    MPI_Finalized(&fin);
    if (fin || !failed_.empty()) return;
    if (own_) own_->ctrl = MPI_COMM_NULL;  // groups split from it stop reading its channel
    if (data_ != MPI_COMM_NULL) MPI_Comm_free(&data_);
    if (ctrl_ != MPI_COMM_NULL) MPI_Comm_free(&ctrl_);
  }

  MPI_Comm data_ = MPI_COMM_NULL, ctrl_ = MPI_COMM_NULL;
  MPI_Request req_ = MPI_REQUEST_NULL;
  int rank_ = 0, size_ = 1;
  mpi_options opts_{};
  std::chrono::microseconds spin_{};  // opts_.spin, or none on an oversubscribed node
  std::uint64_t seq_ = 0;
  detail::comm_slot slot_{};
  bool finished_ = false;
  std::string failed_;
  const char* phase_ = nullptr;  // what this rank does outside a collective (messages); nullptr: slot_
  std::string current() const { return phase_ ? std::string(phase_) : detail::describe(slot_); }
  // This communicator's end-of-run notices (its control channel) and, for a split's group, its
  // root's (where the notices of the group's members arrive), the group's id and each member's
  // rank in the root (mpi_control.hpp). A root's root_ is its own_.
  std::shared_ptr<mpi_detail::lineage> own_, root_;
  std::uint64_t group_id_ = 0;
  std::vector<int> root_rank_;
  std::vector<std::byte> staging_;
  mpi_detail::peer_exchange exchange_;  // this collective's point-to-point messages (mpi_exchange.hpp)
  mpi_detail::probes probes_;           // the timeout's questions and answers (mpi_control.hpp)
};

static_assert(check_communicator<mpi_comm>());

}  // namespace zshard

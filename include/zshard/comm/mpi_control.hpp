#pragma once
// The control channel of mpi_comm (comm/mpi_comm.hpp), beside its collectives: a rank's
// end-of-run notice, shared with the communicators split from it, and the probes a timed-out rank
// sends to learn where its peers are.
//
// End-of-run notices: what an mpi_comm shares with the communicators split from it (and those
// split from them), so that a rank that ends its run tells the ranks still waiting in a group's
// collective too.
// A rank ends its run with finish() on the communicator it was given (run_mpi's, the root of
// its lineage): its "finished" notice goes over the root's control channel and carries, besides
// the collectives it called on the root, the collectives it called in each of its groups (named
// by a group id that every member computes alike from the splits that made the group). A peer
// waiting in collective #k of a group reads the notices from the root's channel while it polls,
// and fails at once when a member finished after fewer than k + 1 collectives in that group: it
// will never join (hybrid sharding's shard and replica groups, where the engine's gathers and
// reductions run, would otherwise wait out the whole collective timeout).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zshard::mpi_detail {

constexpr int done_tag = 0x25a1;    // "I finished after N collectives" (and N in each of my groups)
constexpr int probe_tag = 0x25a2;   // "which collective are you in?" (sent on a timeout)
constexpr int answer_tag = 0x25a3;  // its answer: the collective's number, or finishing
constexpr std::uint64_t finishing = ~std::uint64_t{0};

struct lineage {
  MPI_Comm ctrl = MPI_COMM_NULL;        // the root's control channel; null once the root is released
  std::vector<std::int64_t> peer_done;  // per root rank: collectives it called on the root, -1: running
  std::map<std::pair<int, std::uint64_t>, std::uint64_t> peer_group_done;  // (root rank, group) -> collectives
  std::map<std::uint64_t, std::uint64_t> my_groups;  // this rank's groups: id -> collectives called in it
};

// A group's id from its parent's, the parent's collective number of the split, and the color.
inline std::uint64_t group_id(std::uint64_t parent, std::uint64_t split_seq, int color) noexcept {
  std::uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (std::uint64_t v : {split_seq, static_cast<std::uint64_t>(static_cast<std::uint32_t>(color))})
    h = (h ^ v) * 0x100000001b3ull;
  return h == 0 ? 1 : h;  // 0 is the root
}

// The notice: [collectives on the root, then (group id, collectives in it) pairs].
inline std::vector<std::uint64_t> done_notice(const lineage& l, std::uint64_t root_collectives) {
  std::vector<std::uint64_t> out{root_collectives};
  for (const auto& [id, n] : l.my_groups) out.insert(out.end(), {id, n});
  return out;
}

// A split's members in group order (key, then rank: as MPI_Comm_split), each by its rank in the
// root, from every rank's (color, key) pair (`colors_keys`) and, for a communicator that is
// itself a group, its members' root ranks (`root_rank`, empty in the root).
inline std::vector<int> members_by_root_rank(const std::vector<std::int32_t>& colors_keys, int color,
                                             const std::vector<int>& root_rank) {
  std::vector<std::pair<std::int32_t, int>> members;
  for (std::size_t q = 0; q < colors_keys.size() / 2; ++q)
    if (colors_keys[2 * q] == color) members.emplace_back(colors_keys[2 * q + 1], static_cast<int>(q));
  std::sort(members.begin(), members.end());
  std::vector<int> out;
  for (const auto& m : members)
    out.push_back(root_rank.empty() ? m.second : root_rank[static_cast<std::size_t>(m.second)]);
  return out;
}

// Receives every notice waiting on the root's channel into l; returns an MPI error code.
inline int receive_done_notices(lineage& l) {
  if (l.ctrl == MPI_COMM_NULL) return MPI_SUCCESS;
  for (;;) {
    int flag = 0, count = 0;
    MPI_Status st;
    if (const int rc = MPI_Iprobe(MPI_ANY_SOURCE, done_tag, l.ctrl, &flag, &st); rc != MPI_SUCCESS) return rc;
    if (!flag) return MPI_SUCCESS;
    MPI_Get_count(&st, MPI_UINT64_T, &count);
    std::vector<std::uint64_t> v(static_cast<std::size_t>(count > 0 ? count : 1), 0);
    if (const int rc = MPI_Recv(v.data(), count, MPI_UINT64_T, st.MPI_SOURCE, done_tag, l.ctrl, MPI_STATUS_IGNORE);
        rc != MPI_SUCCESS)
      return rc;
    l.peer_done[static_cast<std::size_t>(st.MPI_SOURCE)] = static_cast<std::int64_t>(v[0]);
    for (std::size_t i = 1; i + 1 < v.size(); i += 2) l.peer_group_done[{st.MPI_SOURCE, v[i]}] = v[i + 1];
  }
}

// In a group (id `group`, root_rank[q] the root rank of member q) waiting in collective number
// `waiting_seq`: the first member that finished without joining it, as a message; empty if none.
inline std::string member_gone(const lineage& l, std::uint64_t group, const std::vector<int>& root_rank,
                               std::uint64_t waiting_seq) {
  for (std::size_t q = 0; q < root_rank.size(); ++q) {
    const int w = root_rank[q];
    if (l.peer_done[static_cast<std::size_t>(w)] < 0) continue;
    const auto it = l.peer_group_done.find({w, group});
    const std::uint64_t d = it == l.peer_group_done.end() ? 0 : it->second;  // never called one in it
    if (d <= waiting_seq)
      return "rank " + std::to_string(w) + " (rank " + std::to_string(q) +
             " of this split group) returned (ended its run) after " + std::to_string(d) +
             " collectives in this group without joining this one";
  }
  return {};
}

// The timeout's probes on one control channel: a rank that timed out asks every peer which
// collective it waits in; a rank waiting in any collective answers at once. `check` turns an MPI
// error code into the communicator's failure.
class probes {
 public:
  // Answers every question waiting: `where` is this rank's collective number, or `finishing`.
  template <class Check>
  void answer(MPI_Comm ctrl, std::uint64_t where, Check&& check) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      check(MPI_Iprobe(MPI_ANY_SOURCE, probe_tag, ctrl, &flag, &st));
      if (!flag) return;
      std::uint64_t ignored = 0;
      check(MPI_Recv(&ignored, 1, MPI_UINT64_T, st.MPI_SOURCE, probe_tag, ctrl, MPI_STATUS_IGNORE));
      answers_.push_back(where);  // a deque: the buffer stays put
      MPI_Request rq = MPI_REQUEST_NULL;
      check(MPI_Isend(&answers_.back(), 1, MPI_UINT64_T, st.MPI_SOURCE, answer_tag, ctrl, &rq));
      MPI_Request_free(&rq);
    }
  }

  // Asks every peer where it is (this rank waits in collective `seq`) and names them. One that does
  // not answer within a second (or the timeout, if shorter) is outside zshard's collectives.
  template <class Check>
  std::string where_are_peers(MPI_Comm ctrl, int rank, int size, std::uint64_t seq, std::uint64_t where,
                              std::chrono::milliseconds timeout, Check&& check) {
    if (ctrl == MPI_COMM_NULL) return "the other ranks did not join it";
    probe_ = seq;
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      MPI_Request rq = MPI_REQUEST_NULL;
      check(MPI_Isend(&probe_, 1, MPI_UINT64_T, q, probe_tag, ctrl, &rq));
      MPI_Request_free(&rq);
    }
    std::vector<std::uint64_t> at(static_cast<std::size_t>(size), 0);
    std::vector<bool> answered(static_cast<std::size_t>(size), false);
    answered[static_cast<std::size_t>(rank)] = true;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(1000));
    while (std::find(answered.begin(), answered.end(), false) != answered.end() &&
           std::chrono::steady_clock::now() < deadline) {
      int flag = 0;
      MPI_Status st;
      check(MPI_Iprobe(MPI_ANY_SOURCE, answer_tag, ctrl, &flag, &st));
      if (flag) {
        const auto src = static_cast<std::size_t>(st.MPI_SOURCE);
        check(MPI_Recv(&at[src], 1, MPI_UINT64_T, st.MPI_SOURCE, answer_tag, ctrl, MPI_STATUS_IGNORE));
        answered[src] = true;
      }
      answer(ctrl, where, check);
      std::this_thread::yield();
    }
    std::string silent, same, elsewhere;
    auto add = [](std::string& list, const std::string& item) { list += (list.empty() ? "" : ", ") + item; };
    for (int q = 0; q < size; ++q) {
      const auto uq = static_cast<std::size_t>(q);
      if (q == rank) continue;
      if (!answered[uq])
        add(silent, std::to_string(q));
      else if (at[uq] == seq)
        add(same, std::to_string(q));
      else
        add(elsewhere, "rank " + std::to_string(q) +
                           (at[uq] == finishing ? std::string(" is ending its run")
                                                : " waits in collective #" + std::to_string(at[uq])));
    }
    std::string out;
    if (!silent.empty()) out = "rank(s) " + silent + " did not answer (not in a zshard collective: busy, hung or dead)";
    if (!elsewhere.empty()) out += (out.empty() ? "" : "; ") + elsewhere;
    if (!same.empty()) out += (out.empty() ? "" : "; ") + std::string("rank(s) ") + same + " wait in it too";
    return out;
  }

 private:
  std::uint64_t probe_ = 0;            // what a timed-out rank sends its peers
  std::deque<std::uint64_t> answers_;  // answers in flight (MPI_Isend buffers)
};

}  // namespace zshard::mpi_detail

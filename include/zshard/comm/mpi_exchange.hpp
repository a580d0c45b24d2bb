#pragma once
// The point-to-point messages mpi_comm's collectives are made of, and the reduction of the
// blocks they stage: each collective's arguments
// travel as a header in a first message to every peer (the argument check, mpi_comm.hpp), and
// all_gather and reduce_scatter carry their payload in that same message when it fits
// (mpi_options::inline_bytes), otherwise in one data message per peer sent at the same time.
// Why not MPI's own collectives: measured with Open MPI (bench/comm_bandwidth, bench/NOTES.md),
// MPI_Iallgather takes up to twice as long as the blocking MPI_Allgather, and a separate argument round doubles a small
// collective; direct messages to every peer match the blocking call from 4 KiB to 64 MiB, except that a block a little
// over inline_bytes pays for its header message (about 0.25 us: 0.88-0.92 of MPI at 8 KiB per peer; the same data
// messages without it match MPI). Every rank posts n - 1 sends and n - 1 receives per collective (the bytes of a ring,
// in one step): meant for the process counts of data-parallel training on host memory, not for thousands of ranks.
//
// When ranks disagree, no message may be longer than the receive that takes it: Open MPI 4.1
// reports such a message as truncated only after writing all of it, past the end of the receive
// buffer (measured: a 16 KiB message into an 8 KiB receive overwrote the 8 KiB after it). So a
// first message never exceeds its receive slot (inline_bytes, the same on every rank: mpi_comm
// checks it at construction), and a data message, sent with the first messages, is received only
// once every rank's header matched, when its size is known to be the one expected. (Posting the
// receives after the headers costs nothing measurable: a data message is over the eager size, so
// its transfer waits for the receiver's side of the handshake either way.) After a mismatch the
// sends are left to the MPI_Abort that follows, and the caller's buffers are untouched.
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "zshard/comm/mpi_options.hpp"
#include "zshard/comm/thread_world.hpp"  // the shared reduction kernel (detail::reduce_block)

namespace zshard::mpi_detail {

inline constexpr int first_tag = 1, data_tag = 2;
// A header padded so that an inline payload after it stays 16-byte aligned.
inline constexpr std::size_t header_room = 32;
static_assert(sizeof(header) <= header_room);

inline header header_of(const detail::comm_slot& s) {
  return header{s.seq,
                s.count,
                s.root,
                static_cast<std::uint8_t>(s.kind),
                static_cast<std::uint8_t>(s.type),
                static_cast<std::uint8_t>(s.op),
                0};
}

// One collective's messages: a receive slot per peer for its first message, this rank's first
// message to each peer (reduce_scatter sends each peer a different block), and the requests.
class peer_exchange {
 public:
  // A new round on `comm` for this rank of `size` ranks, whose first messages are at most
  // `slot_bytes` long.
  void start(MPI_Comm comm, int rank, int size, std::size_t slot_bytes) {
    comm_ = comm;
    rank_ = rank;
    size_ = size;
    slot_bytes_ = slot_bytes;
    const std::size_t bytes = static_cast<std::size_t>(size) * slot_bytes;
    if (received_.size() < bytes) received_.resize(bytes);
    if (outgoing_.size() < bytes) outgoing_.resize(bytes);
    first.clear();
    data.clear();
  }
  const std::byte* payload_from(int q) noexcept { return received(q) + header_room; }

  // One data message of `count` elements of mt to every peer, from send_to(q). check(rc) is
  // given every MPI return code.
  template <class SendTo, class Check>
  void post_data_sends(int count, MPI_Datatype mt, SendTo&& send_to, Check&& check) {
    for (int q = 0; q < size_; ++q)
      if (q != rank_) check(MPI_Isend(send_to(q), count, mt, q, data_tag, comm_, next(data)));
  }
  // Every peer's data message into receive_at(q): only once every header matched (see above).
  template <class ReceiveAt, class Check>
  void post_data_receives(int count, MPI_Datatype mt, ReceiveAt&& receive_at, Check&& check) {
    for (int q = 0; q < size_; ++q)
      if (q != rank_) check(MPI_Irecv(receive_at(q), count, mt, q, data_tag, comm_, next(data)));
  }

  // The first messages: a receive from every peer, and to every peer `h` followed by `payload`
  // bytes from payload_for(q) (payload_for: nullptr for the header alone).
  template <class PayloadFor, class Check>
  void post_first(const header& h, std::size_t payload, PayloadFor&& payload_for, Check&& check) {
    const int slot = static_cast<int>(slot_bytes_), bytes = static_cast<int>(header_room + payload);
    for (int q = 0; q < size_; ++q)
      if (q != rank_) check(MPI_Irecv(received(q), slot, MPI_BYTE, q, first_tag, comm_, next(first)));
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      std::byte* out = outgoing(q);
      std::memcpy(out, &h, sizeof h);
      if constexpr (!std::is_null_pointer_v<std::remove_cvref_t<PayloadFor>>)
        if (payload != 0) std::memcpy(out + header_room, payload_for(q), payload);
      check(MPI_Isend(out, bytes, MPI_BYTE, q, first_tag, comm_, next(first)));
    }
  }

  // After the first messages: "rank 0 called X, rank 2 called Y" when the ranks' headers differ
  // (this rank's is `mine`),
  // empty when every rank called the same collective with the same arguments.
  std::string mismatch(const header& mine) {
    bool same = true;  // the common case, without building anything
    for (int q = 0; q < size_ && same; ++q) same = q == rank_ || std::memcmp(received(q), &mine, sizeof mine) == 0;
    if (same) return {};
    std::vector<header> all(static_cast<std::size_t>(size_));
    for (int q = 0; q < size_; ++q)
      if (q == rank_)
        all[static_cast<std::size_t>(q)] = mine;
      else
        std::memcpy(&all[static_cast<std::size_t>(q)], received(q), sizeof(header));
    std::string diff;
    bool differs = false;
    for (int q = 0; q < size_; ++q) {
      const header& o = all[static_cast<std::size_t>(q)];
      if (q != 0 && std::memcmp(&o, &all[0], sizeof o) == 0) continue;
      differs = differs || q != 0;
      const detail::comm_slot s{static_cast<detail::collective>(o.kind),
                                o.seq,
                                nullptr,
                                nullptr,
                                o.count,
                                static_cast<dtype>(o.type),
                                static_cast<reduce_op>(o.op),
                                o.root};
      diff += (q == 0 ? "rank 0 called " : ", rank " + std::to_string(q) + " called ") + detail::describe(s);
    }
    return differs ? diff : std::string();
  }

  std::vector<MPI_Request> first, data;  // this round's first messages (both ways), data messages

 private:
  static MPI_Request* next(std::vector<MPI_Request>& requests) { return &requests.emplace_back(MPI_REQUEST_NULL); }
  std::byte* received(int q) noexcept { return received_.data() + static_cast<std::size_t>(q) * slot_bytes_; }
  std::byte* outgoing(int q) noexcept { return outgoing_.data() + static_cast<std::size_t>(q) * slot_bytes_; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::size_t slot_bytes_ = header_room;
  std::vector<std::byte> received_, outgoing_;
};

// all_reduce's all-to-all of an even split (thread_comm's split_range): the elements this rank
// sends each rank q (its slice q: lens[q] at offs[q]) and where it receives every rank's copy of
// its own slice (mine_lens[q] at mine_offs[q]), as MPI_Alltoallv takes them.
struct split_layout {
  std::vector<int> lens, offs, mine_lens, mine_offs;
};
inline split_layout even_split_layout(std::size_t count, int size, int rank) {
  const auto un = static_cast<std::size_t>(size);
  split_layout l{std::vector<int>(un), std::vector<int>(un), std::vector<int>(un), std::vector<int>(un)};
  for (int q = 0; q < size; ++q) {
    const auto [lo, hi] = detail::split_range(count, size, q);
    l.lens[static_cast<std::size_t>(q)] = static_cast<int>(hi - lo);
    l.offs[static_cast<std::size_t>(q)] = static_cast<int>(lo);
  }
  const int my_len = l.lens[static_cast<std::size_t>(rank)];
  for (std::size_t q = 0; q < un; ++q) {
    l.mine_lens[q] = my_len;
    l.mine_offs[q] = static_cast<int>(q) * my_len;
  }
  return l;
}

// Reduces `len` elements of each of `size` staged blocks (block q at staged + q * stride
// elements) in rank order into out, with thread_comm's kernel, one chunk at a time.
inline void reduce_staged(const std::byte* staged, int size, dtype t, std::size_t len, std::size_t stride, reduce_op op,
                          void* out) {
  detail::visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T* base = reinterpret_cast<const T*>(staged);
    T* o = static_cast<T*>(out);
    for (std::size_t done = 0; done < len; done += detail::reduce_chunk) {
      const std::size_t m = std::min(detail::reduce_chunk, len - done);
      const auto src_of = [&](int q) { return base + static_cast<std::size_t>(q) * stride + done; };
      if (m == detail::reduce_chunk)
        detail::reduce_block<T, detail::reduce_chunk>(src_of, size, m, op, o + done);
      else
        detail::reduce_block<T, 0>(src_of, size, m, op, o + done);
    }
  });
}

}  // namespace zshard::mpi_detail

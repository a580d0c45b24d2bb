#pragma once
// The MPI communicator's options and the helpers its calls share (error strings, types, back-off).
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "zshard/comm/communicator.hpp"
#include "zshard/comm/thread_world.hpp"  // default_comm_timeout

namespace zshard {

struct mpi_options {
  std::chrono::milliseconds timeout = default_comm_timeout;  // per collective, and for construction
  // Exchange each collective's arguments before its data (mpi_comm.hpp). all_gather and
  // reduce_scatter always carry them with their own messages, at no extra round, checked either way.
  // Off, all_reduce, broadcast and barrier go straight to MPI's collectives, where ranks that
  // disagree (another collective, another count) are MPI's undefined behaviour: a hang found by
  // the timeout, or a message longer than its receive written past the receive's end.
  bool check_arguments = true;
  // A collective's first message to each peer (its header, and its payload when that fits) is at
  // most this long; a larger payload follows in a message of its own (mpi_exchange.hpp). Open
  // MPI's shared-memory transport sends up to 4 KiB eagerly. The same on every rank (checked at
  // construction, as check_arguments); each communicator keeps two buffers of size() *
  // inline_bytes. At most 1 MiB.
  std::size_t inline_bytes = 4096;
  // How long a wait polls MPI without yielding the core. MPI moves a large message one
  // fragment per poll, so a yield (a whole time slice on a loaded machine) per poll slows it;
  // but with more processes than cores a spinning waiter takes the core its peer needs: where
  // the launcher says this node runs more ranks than it has hardware threads
  // (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS), mpi_comm yields at once, as Open MPI's own
  // waits do when oversubscribed.
  std::chrono::microseconds spin{1000};
};

namespace mpi_detail {
// mpi_options::inline_bytes at most this: each communicator keeps 2 x size() slots of it.
inline constexpr std::size_t max_inline_bytes = std::size_t{1} << 20;

// Usage errors for options no communicator can work with, before any communication.
inline void check_options(const mpi_options& o) {
  ZSHARD_REQUIRE(o.timeout.count() > 0, error_kind::usage, "mpi_comm timeout must be positive");
  ZSHARD_REQUIRE(o.inline_bytes <= max_inline_bytes, error_kind::usage,
                 "mpi_options::inline_bytes " + std::to_string(o.inline_bytes) + " exceeds " +
                     std::to_string(max_inline_bytes) + " bytes",
                 "it sizes a message per peer: a few KiB (the transport's eager size, 4 KiB by default)");
}
// The options that shape messages (inline_bytes, check_arguments), as values whose maximum over
// the ranks (MPI_MAX) gives both ends of each: {x, -x} per option.
struct shaping_options {
  std::int64_t values[4];
  explicit shaping_options(const mpi_options& o)
      : values{static_cast<std::int64_t>(o.inline_bytes), -static_cast<std::int64_t>(o.inline_bytes),
               o.check_arguments ? 1 : 0, o.check_arguments ? -1 : 0} {}
  // After the reduction: what differs between ranks, empty when nothing does.
  std::string disagreement() const {
    std::string d;
    if (values[0] != -values[1])
      d = "inline_bytes from " + std::to_string(-values[1]) + " to " + std::to_string(values[0]);
    if (values[2] != -values[3])
      d += std::string(d.empty() ? "" : "; ") + "check_arguments on some ranks, off on others";
    return d;
  }
};

inline std::string error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}
// Element types as MPI sees them: it only copies, so bf16/f16 travel as 16-bit integers.
inline MPI_Datatype type_of(dtype t) noexcept { return t == dtype::f32 ? MPI_FLOAT : MPI_UINT16_T; }
// What each rank publishes before a collective (check_arguments): compared across ranks.
struct header {
  std::uint64_t seq, count;
  std::int32_t root;
  std::uint8_t kind, type, op, pad;
};
// How many ranks the launcher started on this node (0: it does not say).
inline unsigned launcher_local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name)) return static_cast<unsigned>(std::strtoul(v, nullptr, 10));
  return 0;
}
// The spin a wait may use: none where this node's ranks outnumber its hardware threads.
inline std::chrono::microseconds spin_for_node(std::chrono::microseconds spin) {
  const unsigned local = launcher_local_ranks(), cores = std::thread::hardware_concurrency();
  return local != 0 && cores != 0 && local > cores ? std::chrono::microseconds(0) : spin;
}
// How long a wait has polled, for its timeout and back-off. The clock is read once per 16 polls,
// from the 16th on: a small collective is done before it, and a read per poll was a tenth of a
// 16 KiB all_gather's time (perf: __vdso_clock_gettime 8 %, most of the 0.45 us it trailed bare
// MPI_Isend/Irecv by). So a timeout counts from the 16th poll and is checked every 16th.
class poll_clock {
 public:
  // Counts a poll; true when the clock was read on it (waited() is then up to date).
  bool tick() {
    if (++polls_ % polls_per_read != 0) return false;
    const auto now = std::chrono::steady_clock::now();
    if (polls_ == polls_per_read) start_ = now;
    waited_ = now - start_;
    return true;
  }
  std::chrono::steady_clock::duration waited() const noexcept { return waited_; }

 private:
  static constexpr int polls_per_read = 16;
  std::uint64_t polls_ = 0;
  std::chrono::steady_clock::time_point start_{};
  std::chrono::steady_clock::duration waited_{};
};
// MPI progresses a transfer only inside MPI calls (MPI_Test here), one fragment at a time: a
// sleeping poller throttles a large collective to a fragment per sleep (measured: 4 MiB
// all_gather 50x slower with 20 us sleeps). So spin (mpi_options::spin), then yield, as
// MPI_Wait does, and sleep only once a wait has lasted long enough to be a lagging peer.
inline void back_off(std::chrono::steady_clock::duration waited, std::chrono::microseconds spin) {
  if (waited < spin) return;
  if (waited < std::chrono::seconds(2))
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
}  // namespace mpi_detail

}  // namespace zshard

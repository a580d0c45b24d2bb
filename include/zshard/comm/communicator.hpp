#pragma once
// The communicator concept: the collectives ZeRO-3 needs, over plain host or device pointers.
// The thread, MPI and NCCL communicators satisfy it; the engine is written against it only.
//
// Contract every communicator keeps (tests/comm holds the thread communicator to it, tests/mpi
// the MPI one, bit for bit against threads; NCCL's exceptions are listed in nccl_comm.hpp):
//
// - Equal counts. Every collective takes the same `count` on every rank, and every rank must
//   call the same collectives in the same order with the same count, dtype, op and root. The
//   caller pads, not the communicator: a parameter of n elements over w ranks is stored as
//   padded_count(n, w) = shard_count(n, w) * w elements, and rank r owns elements
//   [r * shard_count, (r + 1) * shard_count). Padding is zero and stays zero under sum,
//   average and max-of-zeros, so it never leaks into real elements.
// - Layout. all_gather: each rank contributes `count` elements; dst holds size() * count with
//   rank r's block at r * count. reduce_scatter: src holds size() * count; rank r receives the
//   reduction of block r (count elements). all_reduce and broadcast: count elements in place.
// - In place. all_reduce accepts src == dst. all_gather accepts src == dst + rank() * count,
//   reduce_scatter accepts dst == src + rank() * count (NCCL's rules). Any other overlap
//   between src and dst is a usage error.
// - Ops. reduce_scatter takes sum or average; all_reduce takes sum, average or max. average is
//   the sum divided by size() (one division, in f32).
// - Determinism. Reductions add ranks in rank order 0..size()-1, so the result does not depend
//   on timing and every rank receives bitwise identical values; a rerun reproduces them.
// - Precision. bf16 and f16 are reduced with f32 accumulation and rounded to the element type
//   once, at the end, to nearest even. f32 is summed in f32.
// - count == 0 is valid: the collective still synchronises (and checks arguments match);
//   pointers may then be null.
// - Failure. A collective that fails (a peer failed, a timeout, mismatched arguments) throws
//   zshard::error with error_kind::comm; bad arguments on the calling rank (null pointer with
//   count > 0, bad root, unsupported op) throw error_kind::usage.
// - Streams. Every collective takes, last, the stream it is ordered on (comm_stream, as CUB and
//   NCCL take theirs): nothing is sticky, so no caller has to undo a setting. A communicator
//   that enqueues work (NCCL) runs the collective in that stream's order; one that completes
//   each collective before returning (threads, MPI, null) ignores it, since a finished
//   collective is ordered with every stream.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include "zshard/core/dtype.hpp"
#include "zshard/core/enum_name.hpp"
#include "zshard/core/error.hpp"

namespace zshard {

enum class reduce_op { sum, average, max };  // average = sum / size()

constexpr std::string_view to_string(reduce_op op) noexcept {
  return enum_name(op, {{reduce_op::sum, "sum"}, {reduce_op::average, "average"}, {reduce_op::max, "max"}});
}

// The stream a collective is ordered on, as an opaque handle: a cudaStream_t for NCCL, a
// checker's stream id in tests; 0 means "none given" (NCCL: the communicator's own stream).
// Built from a backend stream with comm_stream::of(stream); a stream without handle() (host,
// phantom) gives none.
struct comm_stream {
  std::uintptr_t handle = 0;

  template <class Stream>
  static comm_stream of(const Stream& s) noexcept {
    if constexpr (requires { s.handle(); }) {
      using handle_type = decltype(s.handle());
      if constexpr (std::is_pointer_v<handle_type>)
        return {reinterpret_cast<std::uintptr_t>(s.handle())};
      else
        return {static_cast<std::uintptr_t>(s.handle())};
    } else {
      return {};
    }
  }
  // The handle as the communicator's native type (cudaStream_t, an int id).
  template <class Native>
  Native as() const noexcept {
    if constexpr (std::is_pointer_v<Native>)
      return reinterpret_cast<Native>(handle);
    else
      return static_cast<Native>(handle);
  }
  explicit operator bool() const noexcept { return handle != 0; }
};

// A communicator opts in by declaring `using zshard_tag = zshard::communicator_tag;`, so a
// type that merely happens to have matching member names is not taken for one.
struct communicator_tag {};

// Elements each rank owns of a parameter of n elements over `world` ranks: ceil(n / world).
constexpr std::size_t shard_count(std::size_t n, int world) {
  if (world <= 0) throw error(error_kind::config, "world size must be positive");
  const auto w = static_cast<std::size_t>(world);
  return n / w + (n % w != 0 ? 1 : 0);
}

// Elements the partitioner allocates for a full (gathered) parameter: n rounded up to a
// multiple of `world`, so every rank contributes an equal shard to the collectives.
constexpr std::size_t padded_count(std::size_t n, int world) {
  return shard_count(n, world) * static_cast<std::size_t>(world);
}

namespace detail {
template <class C>
concept comm_tagged = requires {
  typename C::zshard_tag;
}
&&std::same_as<typename C::zshard_tag, communicator_tag>;
template <class C>
concept comm_has_rank_size = requires(const C& cc) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
};
template <class C>
concept comm_has_all_gather = requires(C& c, const void* src, void* dst, std::size_t count, dtype t, comm_stream s) {
  c.all_gather(src, dst, count, t, s);
};
template <class C>
concept comm_has_reduce_scatter =
    requires(C& c, const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream s) {
  c.reduce_scatter(src, dst, count, t, op, s);
};
template <class C>
concept comm_has_all_reduce =
    requires(C& c, const void* src, void* dst, std::size_t count, dtype t, reduce_op op, comm_stream s) {
  c.all_reduce(src, dst, count, t, op, s);
};
template <class C>
concept comm_has_broadcast = requires(C& c, void* dst, std::size_t count, dtype t, int root, comm_stream s) {
  c.broadcast(dst, count, t, root, s);
};
template <class C>
concept comm_has_barrier = requires(C& c, comm_stream s) {
  c.barrier(s);
};
}  // namespace detail

// Spelled as the conjunction of the pieces check_communicator() reports one by one, so the
// concept and its diagnostics cannot drift apart.
template <class C>
concept communicator = detail::comm_tagged<C> && detail::comm_has_rank_size<C> && detail::comm_has_all_gather<C> &&
    detail::comm_has_reduce_scatter<C> && detail::comm_has_all_reduce<C> && detail::comm_has_broadcast<C> &&
    detail::comm_has_barrier<C>;

// Optional: a communicator that launches several collectives as one (NCCL groups). Between
// group_start() and group_end() collectives are only recorded; they run, and may be waited
// for, at group_end(). So nothing issued inside a group may depend on a collective of the
// same group.
template <class C>
concept groupable = requires(C& c) {
  c.group_start();
  c.group_end();
};

// Every zshard communicator (thread, MPI, NCCL, null) can also be split into sub-groups:
// split(color, key) is a collective that returns a communicator of the same type over the ranks
// that passed the same color (>= 0), ranked by (key, parent rank), as MPI_Comm_split. Hybrid
// sharding builds on it (shard within a group, replicate across groups).
template <class C>
concept splittable = requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

// Runs issue() with its collectives launched together where the communicator can group them,
// one by one where it cannot; the group is closed even when issue() throws.
template <class Comm, class Issue>
void grouped(Comm& comm, Issue&& issue) {
  if constexpr (groupable<Comm>) {
    comm.group_start();
    try {
      issue();
    } catch (...) {
      try {
        comm.group_end();
      } catch (...) {
        // the first failure is the one to report
      }
      throw;
    }
    comm.group_end();
  } else {
    issue();
  }
}

// ---- collective identity (optional capability) -----------------------------------------------
// Two same-size collectives look alike to a transport: rank 0 gathering block 3 pairs with rank
// 1 gathering block 4 and both silently receive a mix of the two (I9). A communicator that can
// carry a little metadata with each collective takes a collective_tag, the identity of what
// the collective moves, as an optional last argument after the stream, and fails the
// collective on every rank (error_kind::comm, naming each rank's tag) when ranks' tags differ.
//
// Adopting it in another host communicator (MPI): add `const collective_tag& tag = {}` as the
// last parameter of all_gather, reduce_scatter, all_reduce and broadcast; before the data moves,
// exchange the tags (for MPI: an MPI_Allgather of the tag's words(), 32 bytes a rank, or a
// compare of hashes with MPI_Allreduce max of h and of ~h) and throw error(error_kind::comm,
// "...: " + describe(tag) ...) on every rank if any differs. Untagged calls (tag.use ==
// collective_use::untagged) compare like any other tag. tags_collectives<C> then holds and the
// engine passes its tags. A transport that cannot carry them (NCCL) simply does not take the
// argument: the engine then relies on its schedule fingerprint (engine/schedule_fingerprint.hpp),
// compared at every step() before the optimizer applies anything, or at every scope when
// engine_config::check_every_scope is set.
enum class collective_use : std::uint8_t {
  untagged,
  gather,        // a scope's own parameters
  gather_ahead,  // gathered ahead for a later scope (Prefetcher)
  reduce,        // a gradient reduction
  step_check,    // step(): gradient statistics and the schedule fingerprint
  scope_check,   // check_every_scope: the schedule fingerprint
  setup,         // construction: model and settings
  gather_param,  // engine::gather_param
  discard,       // engine::discard_gradients
  arguments,     // a collective call's arguments, compared across ranks (set_trainable, write_param, ...)
  param_state,   // a parameter's full value, gradient or optimizer state (engine/full_state.hpp)
};

constexpr std::string_view to_string(collective_use u) noexcept {
  switch (u) {
    case collective_use::untagged: return "untagged";
    case collective_use::gather: return "gather";
    case collective_use::gather_ahead: return "gather ahead";
    case collective_use::reduce: return "reduce";
    case collective_use::step_check: return "step check";
    case collective_use::scope_check: return "scope check";
    case collective_use::setup: return "setup";
    case collective_use::gather_param: return "gather_param";
    case collective_use::discard: return "discard";
    case collective_use::arguments: return "arguments";
    case collective_use::param_state: return "param_state";
  }
  return "?";
}

struct collective_tag {
  static constexpr std::uint32_t none = 0xffffffffu;
  collective_use use = collective_use::untagged;
  std::uint32_t module = none;  // the module whose scope issues it
  std::uint32_t param = none;   // the parameter it moves
  std::uint64_t scope = 0;      // the scope number on this rank (scopes opened since construction)
  std::uint64_t hash = 0;       // the schedule fingerprint when it was issued

  friend bool operator==(const collective_tag&, const collective_tag&) = default;
};

inline std::string describe(const collective_tag& t) {
  if (t.use == collective_use::untagged) return "untagged";
  std::string d(to_string(t.use));
  if (t.module != collective_tag::none) d += " in scope #" + std::to_string(t.scope) + " of module " + std::to_string(t.module);
  if (t.param != collective_tag::none) d += ", parameter " + std::to_string(t.param);
  char h[40];
  std::snprintf(h, sizeof h, ", schedule %016llx", static_cast<unsigned long long>(t.hash));
  return d + h;
}

// A communicator that takes a collective_tag as the last argument of every data collective.
template <class C>
concept tags_collectives = requires(C& c, const void* src, void* dst, std::size_t n, dtype t, reduce_op op, int root,
                                    comm_stream s, const collective_tag& tag) {
  c.all_gather(src, dst, n, t, s, tag);
  c.reduce_scatter(src, dst, n, t, op, s, tag);
  c.all_reduce(src, dst, n, t, op, s, tag);
  c.broadcast(dst, n, t, root, s, tag);
};

// The collectives with a tag, passed on where the communicator takes one and dropped where not.
namespace tagged {
template <class Comm>
void all_gather(Comm& c, const void* src, void* dst, std::size_t n, dtype t, comm_stream s, const collective_tag& tag) {
  if constexpr (tags_collectives<Comm>)
    c.all_gather(src, dst, n, t, s, tag);
  else
    c.all_gather(src, dst, n, t, s);
}
template <class Comm>
void reduce_scatter(Comm& c, const void* src, void* dst, std::size_t n, dtype t, reduce_op op, comm_stream s,
                    const collective_tag& tag) {
  if constexpr (tags_collectives<Comm>)
    c.reduce_scatter(src, dst, n, t, op, s, tag);
  else
    c.reduce_scatter(src, dst, n, t, op, s);
}
template <class Comm>
void all_reduce(Comm& c, const void* src, void* dst, std::size_t n, dtype t, reduce_op op, comm_stream s,
                const collective_tag& tag) {
  if constexpr (tags_collectives<Comm>)
    c.all_reduce(src, dst, n, t, op, s, tag);
  else
    c.all_reduce(src, dst, n, t, op, s);
}
template <class Comm>
void broadcast(Comm& c, void* data, std::size_t n, dtype t, int root, comm_stream s, const collective_tag& tag) {
  if constexpr (tags_collectives<Comm>)
    c.broadcast(data, n, t, root, s, tag);
  else
    c.broadcast(data, n, t, root, s);
}
}  // namespace tagged

// `static_assert(check_communicator<my_comm>());` next to a communicator's definition: each
// missing piece of the contract fails with its own message instead of a wall of template text.
template <class C>
constexpr bool check_communicator() {
  static_assert(detail::comm_tagged<C>, "zshard: a communicator declares `using zshard_tag = zshard::communicator_tag;`");
  static_assert(detail::comm_has_rank_size<C>,
                "zshard: a communicator provides `int rank() const` and `int size() const`");
  static_assert(detail::comm_has_all_gather<C>,
                "zshard: a communicator provides `all_gather(const void* src, void* dst, std::size_t count, dtype, comm_stream)`");
  static_assert(detail::comm_has_reduce_scatter<C>,
                "zshard: a communicator provides "
                "`reduce_scatter(const void* src, void* dst, std::size_t count, dtype, reduce_op, comm_stream)`");
  static_assert(detail::comm_has_all_reduce<C>,
                "zshard: a communicator provides "
                "`all_reduce(const void* src, void* dst, std::size_t count, dtype, reduce_op, comm_stream)`");
  static_assert(detail::comm_has_broadcast<C>,
                "zshard: a communicator provides `broadcast(void* dst, std::size_t count, dtype, int root, comm_stream)`");
  static_assert(detail::comm_has_barrier<C>, "zshard: a communicator provides `barrier(comm_stream)`");
  return communicator<C>;
}

}  // namespace zshard

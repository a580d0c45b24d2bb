#pragma once
// The backend concept: where buffers live and how work on them is ordered. Host (reference),
// CUDA and phantom (accounting only) backends satisfy it.
//
// Ordering model (what lets an asynchronous backend overlap communication with compute):
// work is enqueued on streams; work on one stream runs in order; an event recorded on a stream
// completes when the work enqueued before it has; `wait(stream, event)` makes later work on
// `stream` start after `event`. Nothing here blocks the host except `synchronize`. The host
// backend runs everything immediately, which is a valid schedule of the same program.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "zshard/core/dtype.hpp"
#include "zshard/core/memory_ledger.hpp"
#include "zshard/optim/adamw.hpp"

namespace zshard {

// Sum of squares of a gradient and whether it holds Inf/NaN: what clipping and loss scaling
// need from each rank before a global decision.
struct grad_stats {
  double sum_squares = 0.0;
  bool nonfinite = false;
  grad_stats& operator+=(const grad_stats& o) noexcept {
    sum_squares += o.sum_squares;
    nonfinite = nonfinite || o.nonfinite;
    return *this;
  }
};

// What a stream is for. A backend that runs work asynchronously (CUDA) gives each role its own
// stream through `role_stream(role)`, so gathers and gradient reductions can run while compute
// does; the engine orders them with events (state/stream_roles.hpp). A backend without
// role_stream runs every role on its one stream.
enum class stream_role : std::uint8_t { compute, gather, reduce, host_copy };
inline constexpr std::size_t stream_role_count = 4;
static_assert(static_cast<std::size_t>(stream_role::host_copy) + 1 == stream_role_count,
              "stream_role_count must count every stream_role: arrays of streams are indexed by role");

constexpr std::string_view to_string(stream_role r) noexcept {
  switch (r) {
    case stream_role::compute: return "compute";
    case stream_role::gather: return "gather";
    case stream_role::reduce: return "reduce";
    case stream_role::host_copy: return "host_copy";
  }
  return "?";
}

struct backend_tag {};

template <class B>
concept backend = std::same_as<typename B::zshard_tag, backend_tag> &&
                  requires(B& b, const B& cb, std::size_t bytes, mem_category c, void* p, const void* cp, dtype t,
                           typename B::stream& s, typename B::event& e) {
                    typename B::stream;
                    typename B::event;
                    // false for the phantom backend: pointers are placeholders, never dereferenced
                    { B::holds_storage } -> std::convertible_to<bool>;
                    { b.ledger() } -> std::same_as<memory_ledger&>;
                    { b.allocate(bytes, c) } -> std::same_as<void*>;
                    b.deallocate(p, bytes, c);
                    { b.make_stream() } -> std::same_as<typename B::stream>;
                    { b.make_event() } -> std::same_as<typename B::event>;
                    b.record(e, s);
                    b.wait(s, e);
                    b.synchronize(s);
                    b.copy(p, cp, bytes, s);
                    b.fill_zero(p, bytes, s);
                    b.convert(cp, t, p, t, bytes, s);  // n elements, src dtype -> dst dtype
                    // kernels the engine's default policies need (f32 unless said)
                    b.add_into(static_cast<float*>(p), static_cast<const float*>(cp), bytes, s);  // dst += src
                    { b.grad_stats_of(static_cast<const float*>(cp), bytes, s) } -> std::same_as<grad_stats>;
                    b.adamw(optim::adamw_step{}, static_cast<float*>(p), static_cast<float*>(p),
                            static_cast<float*>(p), static_cast<const float*>(cp), bytes, p, t, s);
                  };

// Optional capabilities an asynchronous backend adds; the engine detects them and falls back to
// one stream without them.
// - role streams: a stream per stream_role (`role_stream(role)`), so work can overlap;
template <class B>
concept has_role_streams = requires(B& b) {
  { b.role_stream(stream_role::gather) } -> std::same_as<typename B::stream>;
};
// - stream-ordered memory: allocate/deallocate in the order of a stream. Memory allocated on s
//   may be used by work on s at once (other streams wait on an event first), and memory freed
//   on s must have every use ordered before that point of s.
template <class B>
concept stream_ordered_memory = requires(B& b, std::size_t n, mem_category c, void* p, typename B::stream& s) {
  { b.allocate(n, c, s) } -> std::same_as<void*>;
  b.deallocate(p, n, c, s);
};

// - batched optimizer and norm kernels: one launch for many tensors instead of one per
//   parameter (the per-parameter launches of a step cost more host time than a GPU needs for the
//   work itself). adamw_batch applies each task as adamw() would, bit for bit, and with
//   zero_grad also zeros each gradient it read; sum_squares_batch writes out[i] = the sum of
//   squares of tensor i in f64 (backend memory), as sum_squares_into would, without a host wait.
struct adamw_task {
  optim::adamw_step step;
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* grad = nullptr;
  std::size_t n = 0;
  void* working_out = nullptr;  // may be null: no working copy written
  dtype working_type = dtype::f32;
};
template <class B>
concept batched_adamw = requires(B& b, std::span<const adamw_task> t, typename B::stream& s) { b.adamw_batch(t, true, s); };
template <class B>
concept batched_sum_squares = requires(B& b, std::span<const float* const> x, std::span<const std::size_t> n,
                                       double* out, typename B::stream& s) { b.sum_squares_batch(x, n, out, s); };
// fill_zero_batch(p, bytes, s): as fill_zero(p[i], bytes[i], s) for every i, in few launches (the
// engine zeroes a backward scope's new gradient buffers with one call).
template <class B>
concept batched_fill_zero = requires(B& b, std::span<void* const> p, std::span<const std::size_t> n,
                                     typename B::stream& s) { b.fill_zero_batch(p, n, s); };

// Fails with a readable message naming the part of the contract a backend misses.
template <class B>
constexpr bool check_backend() {
  static_assert(requires { typename B::zshard_tag; },
                "zshard: a backend declares `using zshard_tag = zshard::backend_tag;`");
  static_assert(requires { typename B::stream; typename B::event; },
                "zshard: a backend defines nested types `stream` and `event`");
  static_assert(requires(B& b, std::size_t n, mem_category c) {
    { b.allocate(n, c) } -> std::same_as<void*>;
  }, "zshard: a backend provides `void* allocate(std::size_t bytes, mem_category)` that charges its ledger");
  static_assert(backend<B>, "zshard: the type does not satisfy zshard::backend; see backend/backend.hpp");
  return true;
}

}  // namespace zshard

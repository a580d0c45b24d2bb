#pragma once
// Which stream each kind of engine work runs on, and the events that order the streams.
//
// The roles (backend.hpp's stream_role): compute (the training stack's kernels, the optimizer,
// anything the host reads), gather (all-gathers of parameters, those the Prefetcher asks for
// ahead included), reduce (reduce-scatters of gradients and their accumulation into gradient
// shards) and host_copy (device-host copies; no engine work uses it yet). With overlap on and a
// backend that has role streams (CUDA), each role has its own stream, so the gather of the next
// module and the reduction of the last one run while the current module computes. Otherwise
// every role shares the backend's one stream and ordering is free. The compute stream may be
// the training stack's own (engine constructor): the engine then orders its work after the
// stack's kernels on that stream with no extra event.
//
// The rules the engine keeps (tests/engine/test_stream_order.cpp checks them with a race
// detector, testing/stream_checker.hpp):
//   - compute waits for a parameter's own gather (a mark, below) before a scope hands it out,
//     and before it frees the gathered buffer (a prefetched parameter may be evicted unused);
//   - reduce waits for compute before reducing what backward wrote;
//   - compute waits for reduce before reading gradient shards (the step);
//   - gather waits for compute after the optimizer wrote the shards (the step).
// For order(), one event per source stream is enough: a wait is enqueued right after its
// record, and a wait captures the event as recorded when it is enqueued, so re-recording it
// later is safe.
//
// Every piece of work is enqueued through on(role), which counts it; order(waiter, source)
// skips the wait when nothing was enqueued on source since waiter last waited for it, so the
// engine can ask for ordering wherever it is needed without paying for redundant events.
//
// order() waits for everything enqueued on the source so far. A parameter gathered ahead needs
// less: only its own gather, not the gathers issued after it for modules further ahead, or
// the prefetch window would shrink to one module whenever gathers are slower than compute.
// For that a point of a stream's work can be marked (mark_now) and waited for later (wait_for).
#include <array>
#include <cstdint>
#include <vector>

#include "zshard/backend/backend.hpp"
#include "zshard/comm/communicator.hpp"

namespace zshard {

template <class Backend>
class stream_roles {
 public:
  using stream = typename Backend::stream;
  static constexpr std::size_t role_count = stream_role_count;

  // `compute`: the training stack's compute stream, when it brings its own (else the backend's).
  stream_roles(Backend& backend, bool overlap, const stream* compute = nullptr)
      : backend_(backend), overlapped_(overlap && has_role_streams<Backend>) {
    for (std::size_t r = 0; r < role_count; ++r) {
      const auto role = static_cast<stream_role>(r);
      if (role == stream_role::compute && compute)
        streams_[r] = *compute;
      else if (!overlapped_)
        streams_[r] = compute ? *compute : backend.make_stream();
      else if constexpr (has_role_streams<Backend>)
        streams_[r] = backend.role_stream(role);
      if (overlapped_) events_[r] = backend.make_event();
    }
  }

  // The stream a role's work runs on, without counting work (to hand to the training stack).
  const stream& stream_of(stream_role role) const noexcept { return streams_[index(role)]; }
  stream_roles(const stream_roles&) = delete;
  stream_roles& operator=(const stream_roles&) = delete;

  // True when gather and reduce run on streams of their own.
  bool overlapped() const noexcept { return overlapped_; }

  // The stream to enqueue `role` work on now; counts the work for order().
  stream& on(stream_role role) noexcept {
    ++enqueued_[index(role)];
    return streams_[index(role)];
  }

  // Work was enqueued on `role` without on(): the training stack's own kernels, which it runs
  // on the compute stream inside a scope. The engine notes them when the scope closes.
  void note_work(stream_role role) noexcept { ++enqueued_[index(role)]; }

  // Work enqueued on `waiter` from now on runs after everything enqueued on `source` so far.
  void order(stream_role waiter, stream_role source) {
    if (!overlapped_) return;
    const std::size_t w = index(waiter), s = index(source);
    if (seen_[w][s] == enqueued_[s]) return;
    backend_.record(events_[s], streams_[s]);
    backend_.wait(streams_[w], events_[s]);
    seen_[w][s] = enqueued_[s];
  }

  // A point in `source`'s work that a waiter can wait for later. enqueued == 0: nothing to wait for.
  struct mark {
    stream_role source = stream_role::compute;
    std::uint32_t slot = 0;
    std::uint64_t enqueued = 0;  // source's count of work when marked
  };

  // Marks everything enqueued on `source` so far.
  mark mark_now(stream_role source) {
    if (!overlapped_) return {};
    const std::size_t s = index(source);
    auto& ring = marks_[s];
    if (ring.empty())
      for (std::size_t i = 0; i < mark_slots; ++i) ring.push_back(backend_.make_event());
    const auto slot = static_cast<std::uint32_t>(next_mark_[s]++ % mark_slots);
    backend_.record(ring[slot], streams_[s]);
    return {source, slot, enqueued_[s]};
  }

  // Work enqueued on `waiter` from now on runs after the marked point. Marks reuse a ring of
  // events: if m's event has been recorded again since, on the same stream, the wait also
  // covers later work there — more than needed, never less.
  void wait_for(stream_role waiter, const mark& m) {
    if (!overlapped_ || m.enqueued == 0) return;
    const std::size_t w = index(waiter), s = index(m.source);
    if (seen_[w][s] >= m.enqueued) return;  // already waited past it (order(), or this mark)
    backend_.wait(streams_[w], marks_[s][m.slot]);
    seen_[w][s] = m.enqueued;  // the parameters gathered in one group share a mark: one wait for all
  }

  // The stream to pass to a collective of `role` (communicator.hpp), counted as work there. A
  // communicator that completes each collective before returning ignores it: it is ordered
  // with every stream already.
  comm_stream collective_on(stream_role role) noexcept { return comm_stream::of(on(role)); }

  // The host waits for everything enqueued on every role.
  void synchronize_all() {
    for (auto& s : streams_) backend_.synchronize(s);
  }

 private:
  static std::size_t index(stream_role r) noexcept { return static_cast<std::size_t>(r); }
  // Marks alive at once: the gathers between a parameter's gather and its use (the prefetch
  // window). Past that, an older mark's wait is merely conservative.
  static constexpr std::size_t mark_slots = 64;

  Backend& backend_;
  bool overlapped_;
  std::array<stream, role_count> streams_{};
  std::array<typename Backend::event, role_count> events_{};
  std::array<std::uint64_t, role_count> enqueued_{};
  std::array<std::array<std::uint64_t, role_count>, role_count> seen_{};  // [waiter][source]
  std::array<std::vector<typename Backend::event>, role_count> marks_{};  // per source, made on first use
  std::array<std::uint64_t, role_count> next_mark_{};
};

}  // namespace zshard

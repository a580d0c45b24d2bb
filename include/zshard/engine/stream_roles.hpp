#pragma once
// Which stream each kind of engine work runs on, and the events that order the streams.
//
// Three roles: compute (the training stack's kernels, the optimizer, anything the host reads),
// gather (all-gathers of parameters, those the Prefetcher asks for ahead included) and reduce
// (reduce-scatters of gradients and their accumulation into gradient shards). With overlap on
// and a backend that has role streams (CUDA), each role has its own stream, so the gather of
// the next module and the reduction of the last one run while the current module computes.
// Otherwise the three roles share the backend's one stream and ordering is free.
//
// The rules the engine keeps (tests/engine/test_stream_order.cpp checks them with a race
// detector, testing/stream_checker.hpp):
//   - compute waits for gather before a scope hands out parameters, and before it frees a
//     gathered buffer (a prefetched parameter may be evicted before anyone used it);
//   - reduce waits for compute before reducing what backward wrote;
//   - compute waits for reduce before reading gradient shards (the step);
//   - gather waits for compute after the optimizer wrote the shards (the step).
// One event per source stream is enough: a wait is enqueued right after its record, and a
// wait captures the event as recorded when it is enqueued, so re-recording it later is safe.
//
// Every piece of work is enqueued through on(role), which counts it; order(waiter, source)
// skips the wait when nothing was enqueued on source since waiter last waited for it, so the
// engine can ask for ordering wherever it is needed without paying for redundant events.
#include <array>
#include <cstdint>

#include "zshard/backend/backend.hpp"
#include "zshard/comm/communicator.hpp"

namespace zshard {

template <class Backend>
class stream_roles {
 public:
  using stream = typename Backend::stream;
  static constexpr std::size_t role_count = 3;  // compute, gather, reduce

  stream_roles(Backend& backend, bool overlap) : backend_(backend), overlapped_(overlap && has_role_streams<Backend>) {
    for (std::size_t r = 0; r < role_count; ++r) {
      if constexpr (has_role_streams<Backend>)
        streams_[r] = overlapped_ ? backend.role_stream(static_cast<stream_role>(r)) : backend.make_stream();
      else
        streams_[r] = backend.make_stream();
      if (overlapped_) events_[r] = backend.make_event();
    }
  }
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

  // Collectives from now on run on `role`'s stream, when the communicator takes a stream. A
  // communicator that does not finishes each collective before returning, so it is ordered
  // with every stream already.
  template <class Comm>
  void bind(Comm& comm, stream_role role) {
    stream& s = on(role);
    if constexpr (stream_bindable<Comm, stream>) comm.set_stream(s.handle());
  }

  // The host waits for everything enqueued on every role.
  void synchronize_all() {
    for (auto& s : streams_) backend_.synchronize(s);
  }

 private:
  static std::size_t index(stream_role r) noexcept { return static_cast<std::size_t>(r); }

  Backend& backend_;
  bool overlapped_;
  std::array<stream, role_count> streams_{};
  std::array<typename Backend::event, role_count> events_{};
  std::array<std::uint64_t, role_count> enqueued_{};
  std::array<std::array<std::uint64_t, role_count>, role_count> seen_{};  // [waiter][source]
};

}  // namespace zshard

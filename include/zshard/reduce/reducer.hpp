#pragma once
// Reducer: turns complete full gradients into this rank's gradient shards.
// A Reducer policy is a family (core/policy_family.hpp): `template <class Backend, class Comm>
// using impl = ...;` names the implementation for a backend and communicator. An implementation
// is constructed from (param_store&, Comm&, const reduce_config&) and provides:
//   grad_ready(p, sink)   p's full gradient (store[p].full_grad, f32, padded) is complete; reduce
//                         it now or when its bucket fills, hand the reduced shard to
//                         sink.accumulate_grad(p, data, n, stream) with the stream it is
//                         ready on, then free the full gradient. Reductions read what compute
//                         wrote: order them after it (store.streams(), state/stream_roles.hpp).
//   flush(sink)           reduce everything pending (end of backward)
//   pending_numel()       full-gradient elements waiting (I6: <= bucket + one module's grads)
// A Reducer sees shards, full gradients and streams; what is gathered is the engine's business
// (state/param_store.hpp keeps it behind a key), so a Reducer cannot break I5.
// Collectives must be issued in the same order on every rank; grad_ready is called in the
// order the training loop runs backward, which every rank shares.
#include <concepts>
#include <cstddef>

#include "zshard/core/policy_family.hpp"
#include "zshard/core/policy_tags.hpp"
#include "zshard/reduce/reduce_config.hpp"
#include "zshard/state/param_store.hpp"

namespace zshard {

template <class R, class Sink>
concept reducer = requires(R& r, const R& cr, param_id p, Sink& sink) {
  r.grad_ready(p, sink);
  r.flush(sink);
  { cr.pending_numel() } -> std::convertible_to<std::size_t>;
};

// The engine checks its Reducer family with the Offloader it hands gradients to (the sink).
template <class Family, class Backend, class Comm, class Sink>
constexpr bool check_reducer() {
  ZSHARD_CHECK_POLICY_FAMILY(Family, Backend, Comm, reducer_tag, "a Reducer policy", "Reducer policy");
  constexpr bool named = policy_named<Family, reducer_tag, Backend, Comm>;
  using impl = policy_impl_t<Family, Backend, Comm>;
  static_assert(!named || std::constructible_from<impl, param_store<Backend>&, Comm&, const reduce_config&>,
                "zshard: a Reducer implementation is constructible from (param_store<Backend>&, Comm&, "
                "const reduce_config&)");
  static_assert(!named || reducer<impl, Sink>,
                "zshard: the Reducer implementation does not provide grad_ready(param_id, Sink&), flush(Sink&) and "
                "pending_numel(); see reduce/reducer.hpp");
  return true;
}

}  // namespace zshard

#pragma once
// Reducer: turns complete full gradients into this rank's gradient shards.
// A Reducer policy is a family: `template <class Backend, class Comm> using impl = ...;` names
// the implementation for a backend and communicator. An implementation is constructed from
// (param_store&, Comm&, const engine_config&) and provides:
//   grad_ready(p, sink)   p's full gradient (store[p].full_grad, f32, padded) is complete; reduce
//                         it now or when its bucket fills, hand the reduced shard to
//                         sink.accumulate_grad(p, data, n, stream) with the stream it is
//                         ready on, then free the full gradient. Reductions read what compute
//                         wrote: order them after it (store.streams(), stream_roles.hpp).
//   flush(sink)           reduce everything pending (end of backward)
//   pending_numel()       full-gradient elements waiting (I6: <= bucket + one module's grads)
// Collectives must be issued in the same order on every rank; grad_ready is called in the
// order the training loop runs backward, which every rank shares.
#include <concepts>
#include <cstddef>

#include "zshard/core/policy_tags.hpp"
#include "zshard/engine/param_store.hpp"

namespace zshard {

template <class R, class Sink>
concept reducer = requires(R& r, const R& cr, param_id p, Sink& sink) {
  r.grad_ready(p, sink);
  r.flush(sink);
  { cr.pending_numel() } -> std::convertible_to<std::size_t>;
};

template <class Family>
concept reducer_family = opts_into<Family, reducer_tag>;

template <class Family, class R, class Sink>
constexpr bool check_reducer() {
  static_assert(reducer_family<Family>,
                "zshard: a Reducer policy declares `using zshard_tag = zshard::reducer_tag;` and "
                "`template <class Backend, class Comm> using impl = ...;`");
  static_assert(reducer<R, Sink>, "zshard: the Reducer implementation does not provide grad_ready/flush/pending_numel; "
                                  "see reduce/reducer.hpp");
  return true;
}

}  // namespace zshard

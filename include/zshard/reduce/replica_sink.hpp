#pragma once
// The second stage of a hybrid gradient reduction (partition/hybrid_layout.hpp): a Reducer
// reduce-scatters a gradient inside the shard group (average over its G ranks) and hands the
// reduced shard to its sink; this sink first all-reduces that shard, in place, across the R
// replica groups that hold the same shard (average over R: the mean over all G x R ranks), then
// passes it on to the Offloader. So it runs shard by shard, as the Reducer's buckets flush, on
// the Reducer's own output buffer: no second copy of a bucket or of a shard (I6).
//
// Without replicas (plain ZeRO-3) it only passes the shard on: the same calls, the same bits.
// Every replica receives bitwise the same shard (the communicator contract's determinism), so
// the replicas' optimizer states stay identical.
#include <cstddef>

#include "zshard/comm/communicator.hpp"
#include "zshard/state/param_store.hpp"

namespace zshard::reduce {

template <class Backend, class Comm, class Sink>
class replica_sink {
 public:
  replica_sink(Sink& inner, Comm* replicas, param_store<Backend>& store)
      : inner_(inner), replicas_(replicas), store_(store) {}

  // `g` is the Reducer's output (or a replicated parameter's full gradient), f32, ready on
  // `ready_on` (the reduce stream); it is the Reducer's scratch, so it is reduced in place.
  void accumulate_grad(param_id p, float* g, std::size_t n, typename Backend::stream& ready_on) {
    if (replicas_ != nullptr)
      tagged::all_reduce(*replicas_, g, g, n, dtype::f32, reduce_op::average, comm_stream::of(ready_on),
                         store_.tag_for(p, collective_use::reduce));
    inner_.accumulate_grad(p, g, n, ready_on);
  }

  Sink& inner() noexcept { return inner_; }

 private:
  Sink& inner_;
  Comm* replicas_;
  param_store<Backend>& store_;
};

}  // namespace zshard::reduce

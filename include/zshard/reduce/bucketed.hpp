#pragma once
// The default Reducer: complete full gradients wait in a bucket of up to reduce_bucket_numel
// elements; a full bucket is reduce-scattered (average over ranks), parameter by parameter,
// straight out of the buffers the backward wrote. Full gradients are allocated padded, so
// nothing is padded or concatenated before communicating: no second copy of a bucket (I6;
// the regression this avoids copied the whole bucket just before the collective). A bucket is
// flushed *before* a gradient that would overflow it is added, so pending elements never
// exceed max(bucket, one parameter).
//
// Replicated parameters (biases, norm gains: at most persistence_threshold_numel each) are
// all-reduced, not reduce-scattered. One collective each would pay a rendezvous (thread_comm)
// or a launch (NCCL) per tiny tensor, so when a flush holds two or more they are packed into
// one staging bucket and all-reduced once: each gradient is copied in and freed at once, so
// the flush's peak is the bucket plus the packed replicated part (the memory planner charges
// exactly that, grad_buckets). The packed reduction averages each element over ranks as the
// single ones did, so results are unchanged.
//
// Reductions run on the reduce stream, after the compute work that wrote the gradients; the
// reduced shard goes to the sink on that stream and the full gradient is freed there.
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/reduce/reducer.hpp"

namespace zshard::reduce {

template <class Backend, class Comm>
class bucketed_reducer {
 public:
  bucketed_reducer(param_store<Backend>& store, Comm& comm, const reduce_config& cfg)
      : store_(store), comm_(comm), bucket_numel_(cfg.reduce_bucket_numel) {
    pending_.reserve(store.size());
  }

  template <class Sink>
  void grad_ready(param_id p, Sink& sink) {
    const auto& s = store_[p];
    if (!s.full_grad) return;  // no backward wrote to it this micro-batch: nothing to reduce
    const std::size_t n = s.layout.padded_numel;
    if (!pending_.empty() && pending_numel_ + n > bucket_numel_) flush(sink);
    pending_.push_back(p);
    pending_numel_ += n;
    if (pending_numel_ >= bucket_numel_) flush(sink);
  }

  // Replicated gradients first (packed when there are several), then the reduce-scatters in
  // the order the gradients arrived.
  template <class Sink>
  void flush(Sink& sink) {
    std::size_t replicated = 0, packed_numel = 0;
    for (param_id p : pending_)
      if (store_[p].layout.replicated) {
        ++replicated;
        packed_numel += store_[p].layout.numel;
      }
    if (replicated >= 2) reduce_packed(packed_numel, sink);
    for (param_id p : pending_)
      if (replicated < 2 || !store_[p].layout.replicated) reduce_one(p, sink);
    pending_.clear();
    pending_numel_ = 0;
  }

  std::size_t pending_numel() const noexcept { return pending_numel_; }
  // Collectives this reducer issued (tests and benches count rendezvous with it).
  std::size_t collectives() const noexcept { return collectives_; }

 private:
  template <class Sink>
  void reduce_packed(std::size_t numel, Sink& sink) {
    auto& streams = store_.streams();
    streams.order(stream_role::reduce, stream_role::compute);
    auto& on = streams.on(stream_role::reduce);
    buffer<Backend> packed(store_.backend(), dtype::f32, numel, mem_category::grad_buckets, on);
    float* dst = packed.template as<float>();
    std::size_t at = 0;
    for (param_id p : pending_) {
      auto& s = store_[p];
      if (!s.layout.replicated) continue;
      store_.backend().copy(dst + at, s.full_grad.data(), s.layout.numel * sizeof(float), on);
      s.full_grad.reset_on(on);
      at += s.layout.numel;
    }
    comm_.all_reduce(dst, dst, numel, dtype::f32, reduce_op::average, streams.collective_on(stream_role::reduce));
    ++collectives_;
    at = 0;
    for (param_id p : pending_) {
      const auto& s = store_[p];
      if (!s.layout.replicated) continue;
      sink.accumulate_grad(p, dst + at, s.layout.numel, on);
      at += s.layout.numel;
    }
    packed.reset_on(on);
  }

  template <class Sink>
  void reduce_one(param_id p, Sink& sink) {
    auto& s = store_[p];
    auto& streams = store_.streams();
    streams.order(stream_role::reduce, stream_role::compute);
    float* full = s.full_grad.template as<float>();
    if (s.layout.replicated) {
      comm_.all_reduce(full, full, s.layout.numel, dtype::f32, reduce_op::average,
                       streams.collective_on(stream_role::reduce));
      ++collectives_;
      sink.accumulate_grad(p, full, s.layout.numel, streams.on(stream_role::reduce));
    } else {
      // Output of the collective: this rank's slice only (1/world of the gradient).
      buffer<Backend> shard(store_.backend(), dtype::f32, s.layout.shard_numel, mem_category::scratch,
                            streams.on(stream_role::reduce));
      comm_.reduce_scatter(full, shard.data(), s.layout.shard_numel, dtype::f32, reduce_op::average,
                           streams.collective_on(stream_role::reduce));
      ++collectives_;
      sink.accumulate_grad(p, shard.template as<float>(), s.layout.shard_numel, streams.on(stream_role::reduce));
      shard.reset_on(streams.on(stream_role::reduce));
    }
    s.full_grad.reset_on(streams.on(stream_role::reduce));
  }

  param_store<Backend>& store_;
  Comm& comm_;
  std::size_t bucket_numel_;
  std::vector<param_id> pending_;
  std::size_t pending_numel_ = 0;
  std::size_t collectives_ = 0;
};

struct bucketed {
  using zshard_tag = reducer_tag;
  template <class Backend, class Comm>
  using impl = bucketed_reducer<Backend, Comm>;
};

}  // namespace zshard::reduce

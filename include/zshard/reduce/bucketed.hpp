#pragma once
// The default Reducer: complete full gradients wait in a bucket of up to reduce_bucket_numel
// elements; a full bucket is reduce-scattered (average over ranks), parameter by parameter,
// straight out of the buffers the backward wrote. Full gradients are allocated padded, so
// nothing is padded or concatenated before communicating: no second copy of a bucket (I6;
// the regression this avoids copied the whole bucket just before the collective). A bucket is
// flushed *before* a gradient that would overflow it is added, so pending elements never
// exceed max(bucket, one parameter).
//
// Reductions run on the reduce stream, after the compute work that wrote the gradients; the
// reduced shard goes to the sink on that stream and the full gradient is freed there.
#include <cstddef>
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

  // A failure leaves the gradients after the failing one pending (still unreduced, on compute)
  // and drops the ones already handed over, so a retry never reduces a freed gradient.
  template <class Sink>
  void flush(Sink& sink) {
    std::size_t done = 0;
    try {
      for (; done < pending_.size(); ++done) reduce_one(pending_[done], sink);
    } catch (...) {
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done + 1));
      pending_numel_ = 0;
      for (param_id p : pending_) pending_numel_ += store_[p].layout.padded_numel;
      throw;
    }
    pending_.clear();
    pending_numel_ = 0;
  }

  std::size_t pending_numel() const noexcept { return pending_numel_; }

  // engine::discard_gradients: drops the pending gradients unreduced (the engine frees them).
  void discard() noexcept {
    pending_.clear();
    pending_numel_ = 0;
  }

 private:
  template <class Sink>
  void reduce_one(param_id p, Sink& sink) {
    auto& s = store_[p];
    auto& streams = store_.streams();
    streams.order(stream_role::reduce, stream_role::compute);
    float* full = s.full_grad.template as<float>();
    // Output of the collective: this rank's slice only (1/world of the gradient).
    buffer<Backend> shard;
    try {
      if (s.layout.replicated) {
        tagged::all_reduce(comm_, full, full, s.layout.numel, dtype::f32, reduce_op::average,
                           streams.collective_on(stream_role::reduce), store_.tag_for(p, collective_use::reduce));
        sink.accumulate_grad(p, full, s.layout.numel, streams.on(stream_role::reduce));
      } else {
        shard = buffer<Backend>(store_.backend(), dtype::f32, s.layout.shard_numel, mem_category::scratch,
                                streams.on(stream_role::reduce));
        tagged::reduce_scatter(comm_, full, shard.data(), s.layout.shard_numel, dtype::f32, reduce_op::average,
                               streams.collective_on(stream_role::reduce), store_.tag_for(p, collective_use::reduce));
        sink.accumulate_grad(p, shard.template as<float>(), s.layout.shard_numel, streams.on(stream_role::reduce));
      }
    } catch (...) {
      // A collective or the sink failed: both buffers may be in use on the reduce stream (an
      // enqueued collective), so they are freed there, not on compute by their destructors.
      shard.reset_on(streams.on(stream_role::reduce));
      s.full_grad.reset_on(streams.on(stream_role::reduce));
      throw;
    }
    shard.reset_on(streams.on(stream_role::reduce));
    s.full_grad.reset_on(streams.on(stream_role::reduce));
  }

  param_store<Backend>& store_;
  Comm& comm_;
  std::size_t bucket_numel_;
  std::vector<param_id> pending_;
  std::size_t pending_numel_ = 0;
};

struct bucketed {
  using zshard_tag = reducer_tag;
  template <class Backend, class Comm>
  using impl = bucketed_reducer<Backend, Comm>;
};

}  // namespace zshard::reduce

#pragma once
// A Reducer with the third mechanism of the original failure (DESIGN.md, "the lesson"): before
// reduce-scattering a bucket it pads and concatenates the bucket's full gradients into a new
// buffer (a second copy of the bucket) and reduce-scatters from that. The copy was used on the
// reduction stream and freed in that stream's order, and the legacy synchronised the stream
// only at the end of backward, so the copies of every bucket of a micro-batch stayed allocated
// until then: a second copy of every gradient, at the worst moment.
//
// Test-only, with legacy_tracker.hpp and legacy_prefetcher.hpp. The arithmetic is the default
// Reducer's (the copy is exact), so training still equals single-process training; only the
// memory differs.
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/reduce/reducer.hpp"
#include "../impl_family.hpp"

namespace legacy {

using namespace zshard;

template <class Backend, class Comm>
class copying_reducer {
 public:
  copying_reducer(param_store<Backend>& store, Comm& comm, const reduce_config& cfg)
      : store_(store), comm_(comm), bucket_numel_(cfg.reduce_bucket_numel) {}

  template <class Sink>
  void grad_ready(param_id p, Sink& sink) {
    const auto& s = store_[p];
    if (!s.full_grad) return;
    const std::size_t n = s.layout.padded_numel;
    if (!pending_.empty() && pending_numel_ + n > bucket_numel_) reduce_bucket(sink);
    pending_.push_back(p);
    pending_numel_ += n;
    if (pending_numel_ >= bucket_numel_) reduce_bucket(sink);
  }

  // End of backward: the last bucket, then the stream is synchronised and the copies go.
  template <class Sink>
  void flush(Sink& sink) {
    reduce_bucket(sink);
    auto& reduce = store_.streams().on(stream_role::reduce);
    store_.backend().synchronize(reduce);
    copies_.clear();
  }

  std::size_t pending_numel() const noexcept { return pending_numel_; }

 private:
  template <class Sink>
  void reduce_bucket(Sink& sink) {
    if (pending_.empty()) return;
    auto& streams = store_.streams();
    auto& reduce = streams.on(stream_role::reduce);
    streams.order(stream_role::reduce, stream_role::compute);
    buffer<Backend> copy(store_.backend(), dtype::f32, pending_numel_, mem_category::grad_buckets, reduce);
    // A phantom backend's buffers are null placeholders: no arithmetic on them.
    auto at = [&copy](std::size_t offset) -> float* {
      if constexpr (Backend::holds_storage)
        return copy.template as<float>() + offset;
      else
        return (void)offset, nullptr;
    };
    std::size_t offset = 0;
    for (param_id p : pending_) {  // pad + concatenate: the second copy
      auto& s = store_[p];
      store_.backend().copy(at(offset), s.full_grad.data(), s.full_grad.bytes(), reduce);
      offset += s.layout.padded_numel;
    }
    offset = 0;
    for (param_id p : pending_) {
      auto& s = store_[p];
      float* full = at(offset);
      offset += s.layout.padded_numel;
      if (s.layout.replicated) {
        comm_.all_reduce(full, full, s.layout.numel, dtype::f32, reduce_op::average,
                         streams.collective_on(stream_role::reduce));
        sink.accumulate_grad(p, full, s.layout.numel, reduce);
      } else {
        buffer<Backend> shard(store_.backend(), dtype::f32, s.layout.shard_numel, mem_category::scratch, reduce);
        comm_.reduce_scatter(full, shard.data(), s.layout.shard_numel, dtype::f32, reduce_op::average,
                             streams.collective_on(stream_role::reduce));
        sink.accumulate_grad(p, shard.template as<float>(), s.layout.shard_numel, reduce);
        shard.reset_on(reduce);
      }
      s.full_grad.reset_on(reduce);
    }
    copies_.push_back(std::move(copy));  // freed in the reduce stream's order: at flush()
    pending_.clear();
    pending_numel_ = 0;
  }

  param_store<Backend>& store_;
  Comm& comm_;
  std::size_t bucket_numel_;
  std::vector<param_id> pending_;
  std::size_t pending_numel_ = 0;
  std::vector<buffer<Backend>> copies_;
};

using copy_bucket = test_support::family<zshard::reducer_tag, copying_reducer>;

}  // namespace legacy

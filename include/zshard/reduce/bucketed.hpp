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
// or a launch (NCCL) per tiny tensor, so the small ones (at most replicated_pack_numel
// elements) are packed in flush order into staging buffers of at most replicated_pack_numel
// elements and each pack is all-reduced once; each gradient is freed as soon as it is copied.
// The flush's peak is the bucket plus one pack, a bounded amount the memory planner charges
// exactly as the ledger sees it (grad_buckets). Averaging is element-wise, so packed results
// equal unpacked ones bit for bit.
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
      : store_(store), comm_(comm), bucket_numel_(cfg.reduce_bucket_numel), pack_numel_(cfg.replicated_pack_numel) {
    pending_.reserve(store.size());
  }

  template <class Sink>
  void grad_ready(param_id p, Sink& sink) {
    const auto& s = store_[p];
    if (!s.full_grad) return;  // no backward wrote to it this micro-batch: nothing to reduce
    const std::size_t n = s.layout.padded_numel;
    if (pending_numel_ + n > bucket_numel_ && !(packed_.empty() && pending_.empty())) flush(sink);
    // Sorted here, while p's state is in cache: a flush then walks each list once.
    (packable(p) ? packed_ : pending_).push_back(p);
    pending_numel_ += n;
    if (pending_numel_ >= bucket_numel_) flush(sink);
  }

  // Packs of small replicated gradients first (a pack of one is all-reduced in place), then
  // every other gradient in the order it arrived.
  // A failure drops what was already handed over (and the gradients of the failing collective,
  // which are freed) and leaves the rest pending, still unreduced on compute, so a retry never
  // reduces a freed gradient: a pending gradient without full_grad has been handed over.
  template <class Sink>
  void flush(Sink& sink) {
    try {
      std::size_t begin = 0, numel = 0, count = 0;
      for (std::size_t i = 0; i < packed_.size(); ++i) {
        if (!store_[packed_[i]].full_grad) continue;  // handed over before a failed flush
        const std::size_t n = store_[packed_[i]].layout.numel;
        if (count > 0 && numel + n > pack_numel_) {
          reduce_pack(begin, i, numel, sink);
          numel = count = 0;
        }
        if (count == 0) begin = i;
        numel += n;
        ++count;
      }
      if (count > 0) reduce_pack(begin, packed_.size(), numel, sink);
      for (param_id p : pending_)
        if (store_[p].full_grad) reduce_one(p, sink);
    } catch (...) {
      const auto handed_over = [&](param_id p) { return !store_[p].full_grad; };
      std::erase_if(packed_, handed_over);
      std::erase_if(pending_, handed_over);
      pending_numel_ = 0;
      for (param_id p : packed_) pending_numel_ += store_[p].layout.padded_numel;
      for (param_id p : pending_) pending_numel_ += store_[p].layout.padded_numel;
      throw;
    }
    packed_.clear();
    pending_.clear();
    pending_numel_ = 0;
  }

  std::size_t pending_numel() const noexcept { return pending_numel_; }
  // Collectives this reducer issued (tests and benches count rendezvous with it).
  std::size_t collectives() const noexcept { return collectives_; }

  // engine::discard_gradients: drops the pending gradients unreduced (the engine frees them).
  void discard() noexcept {
    packed_.clear();
    pending_.clear();
    pending_numel_ = 0;
  }

 private:
  bool packable(param_id p) const {
    const auto& s = store_[p];
    return s.layout.replicated && s.layout.numel <= pack_numel_;
  }

  // The gradients of packed_[begin, end) that were not handed over yet: `numel` elements.
  template <class Sink>
  void reduce_pack(std::size_t begin, std::size_t end, std::size_t numel, Sink& sink) {
    std::vector<param_id>& members = members_;
    members.clear();
    for (std::size_t i = begin; i < end; ++i)
      if (store_[packed_[i]].full_grad) members.push_back(packed_[i]);
    if (members.size() == 1) return reduce_one(members.front(), sink);
    auto& streams = store_.streams();
    streams.order(stream_role::reduce, stream_role::compute);
    auto& on = streams.on(stream_role::reduce);
    buffer<Backend> packed(store_.backend(), dtype::f32, numel, mem_category::grad_buckets, on);
    float* dst = packed.template as<float>();
    std::size_t at = 0;
    for (param_id p : members) {
      auto& s = store_[p];
      store_.backend().copy(dst + at, s.full_grad.data(), s.layout.numel * sizeof(float), on);
      s.full_grad.reset_on(on);
      at += s.layout.numel;
    }
    try {
      // Tagged as its first member: ranks with different packs differ there, in the count, or
      // in the schedule fingerprint the tag carries.
      tagged::all_reduce(comm_, dst, dst, numel, dtype::f32, reduce_op::average,
                         streams.collective_on(stream_role::reduce),
                         store_.tag_for(members.front(), collective_use::reduce));
      ++collectives_;
      at = 0;
      for (param_id p : members) {
        sink.accumulate_grad(p, dst + at, store_[p].layout.numel, on);
        at += store_[p].layout.numel;
      }
    } catch (...) {
      packed.reset_on(on);  // possibly in use by an enqueued collective: freed in the reduce stream's order
      throw;
    }
    packed.reset_on(on);
  }

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
        ++collectives_;
        sink.accumulate_grad(p, full, s.layout.numel, streams.on(stream_role::reduce));
      } else {
        shard = buffer<Backend>(store_.backend(), dtype::f32, s.layout.shard_numel, mem_category::scratch,
                                streams.on(stream_role::reduce));
        tagged::reduce_scatter(comm_, full, shard.data(), s.layout.shard_numel, dtype::f32, reduce_op::average,
                               streams.collective_on(stream_role::reduce), store_.tag_for(p, collective_use::reduce));
        ++collectives_;
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
  std::size_t pack_numel_;
  std::vector<param_id> members_;  // the gradients of the pack being reduced (kept: no allocation per flush)
  std::vector<param_id> packed_;   // pending gradients that go in packs, in arrival order
  std::vector<param_id> pending_;  // the other pending gradients, in arrival order
  std::size_t pending_numel_ = 0;
  std::size_t collectives_ = 0;
};

struct bucketed {
  using zshard_tag = reducer_tag;
  template <class Backend, class Comm>
  using impl = bucketed_reducer<Backend, Comm>;
};

}  // namespace zshard::reduce

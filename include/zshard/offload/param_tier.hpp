#pragma once
// Parameter offload: the working shards of sharded parameters in host memory (the host
// Offloader's resource: page-locked on CUDA unless offload_config::pin_memory is off), one
// allocation per parameter charged to the host ledger as sharded_params; the device keeps no
// shard of them. It is the shard_tier (state/shard_tier.hpp) that offload::host_adam attaches to
// the parameter store when offload_config::params = host.
//
// Uploads: stage(p, consumer) allocates a device buffer of p's shard bytes (device ledger,
// scratch) in the host_copy stream's order, copies the host shard into it there (cudaMemcpyAsync
// from page-locked memory on CUDA, a memcpy on the host backend, nothing on a phantom one), and
// makes the consumer stream (the gather stream, or compute for gather_param) wait for host_copy,
// so the all-gather that reads it runs after the copy. unstage(consumer) frees the staged
// buffers in the consumer stream's order once the group of all-gathers reading them is issued.
// So uploads run in gather order, a group at a time, and the device holds at most one group's
// shards in upload buffers (docs/DESIGN.md, "offload tiers").
//
// The host writes shards (the optimizer's update, state access) only after quiesce(): a copy
// still in flight on host_copy reads the old value.
#include <cstdint>
#include <vector>

#include "zshard/core/buffer.hpp"
#include "zshard/state/param_store.hpp"
#include "zshard/state/shard_tier.hpp"

namespace zshard::offload {

template <class Backend, class Resource>
class param_tier final : public shard_tier<Backend> {
 public:
  // Allocates the host shards of every parameter the store offloads, and attaches itself.
  param_tier(param_store<Backend>& store, Resource& memory) : store_(store) {
    shards_.resize(store.size());
    for (param_id p = 0; p < store.size(); ++p)
      if (store.offloaded(p))
        shards_[p] = buffer<Resource>(memory, store[p].type, store[p].layout.shard_numel, mem_category::sharded_params);
    staged_.reserve(store.size());
    store.attach_tier(*this);
  }
  param_tier(const param_tier&) = delete;
  param_tier& operator=(const param_tier&) = delete;
  // Staged copies are freed on the stream that would have read them; nothing waits here.
  ~param_tier() { unstage(stream_role::gather); }

  void* host_shard(param_id p) noexcept override { return shards_[p].data(); }

  const void* stage(param_id p, stream_role consumer) override {
    auto& streams = store_.streams();
    auto& copy = streams.on(stream_role::host_copy);
    const auto& slot = store_[p];
    buffer<Backend> up(store_.backend(), slot.type, slot.layout.shard_numel, mem_category::scratch, copy);
    store_.backend().copy(up.data(), shards_[p].data(), up.bytes(), copy);
    uploaded_bytes_ += up.bytes();
    streams.order(consumer, stream_role::host_copy);
    staged_.push_back(std::move(up));
    return staged_.back().data();
  }

  void unstage(stream_role consumer) noexcept override {
    if (staged_.empty()) return;
    auto& on = store_.streams().on(consumer);
    for (auto& b : staged_) b.reset_on(on);
    staged_.clear();
  }

  void quiesce() override { store_.backend().synchronize(store_.streams().on(stream_role::host_copy)); }

  // Bytes copied to the device since construction (the plan's traffic counts the same).
  std::uint64_t uploaded_bytes() const noexcept { return uploaded_bytes_; }

 private:
  param_store<Backend>& store_;
  std::vector<buffer<Resource>> shards_;  // per parameter; empty unless offloaded
  std::vector<buffer<Backend>> staged_;   // copies staged for collectives not yet issued
  std::uint64_t uploaded_bytes_ = 0;
};

}  // namespace zshard::offload

#pragma once
// Per-rank storage of every parameter: its layout, its working shard, and — while in use — its
// gathered full value and its full gradient; and the role streams that order work on them
// (stream_roles.hpp). The store owns the buffers; policies decide when they come and go.
// Resident gathered elements (invariant I5) move only together with the set of gathered
// parameters — in the two functions that add to and remove from it — so the figure cannot
// drift from the set or be reset on its own; the engine cross-checks it against a full scan at
// every step boundary.
#include <vector>

#include "zshard/core/buffer.hpp"
#include "zshard/engine/stream_roles.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/partitioner.hpp"

namespace zshard {

template <class Backend>
struct param_slot {
  const param_spec* spec = nullptr;
  shard_layout layout{};
  dtype type = dtype::f32;       // working dtype
  buffer<Backend> shard;         // this rank's slice (whole value when replicated)
  buffer<Backend> gathered;      // padded full value while gathered (never for replicated)
  buffer<Backend> full_grad;     // f32, padded, while backward accumulates into it
  int pins = 0;                  // open scopes using this parameter
  int holds = 0;                 // modules the HookTracker holds gathered that list this parameter
  std::size_t set_index = 0;     // position in the store's gathered set while gathered
  // The end of p's gather on the gather stream, until compute has waited for it.
  typename stream_roles<Backend>::mark gather_done{};

  // Gathered but neither in use nor held: may be released to make room.
  bool evictable() const noexcept { return gathered && pins == 0 && holds == 0; }

  bool is_gathered() const noexcept { return layout.replicated || static_cast<bool>(gathered); }
  // The full (unpadded) value, valid while gathered.
  void* full_data() const noexcept { return layout.replicated ? shard.data() : gathered.data(); }
};

template <class Backend>
class param_store {
 public:
  param_store(Backend& backend, const model_spec& spec, std::vector<shard_layout> layouts, dtype default_type,
              bool overlap = false)
      : backend_(backend), spec_(spec), streams_(backend, overlap) {
    slots_.resize(spec.params().size());
    for (std::size_t p = 0; p < slots_.size(); ++p) {
      auto& s = slots_[p];
      s.spec = &spec.params()[p];
      s.layout = layouts[p];
      s.type = s.spec->type.value_or(default_type);
      s.shard = buffer<Backend>(backend, s.type, s.layout.shard_numel, mem_category::sharded_params);
    }
    gathered_set_.reserve(slots_.size());
  }

  Backend& backend() noexcept { return backend_; }
  const model_spec& spec() const noexcept { return spec_; }
  stream_roles<Backend>& streams() noexcept { return streams_; }
  const stream_roles<Backend>& streams() const noexcept { return streams_; }
  std::size_t size() const noexcept { return slots_.size(); }
  param_slot<Backend>& operator[](param_id p) noexcept { return slots_[p]; }
  const param_slot<Backend>& operator[](param_id p) const noexcept { return slots_[p]; }

  // Allocates the gathered buffer in the gather stream's order and records p as resident; the
  // caller fills it on that stream.
  void mark_gathered(param_id p) {
    auto& s = slots_[p];
    s.gathered = buffer<Backend>(backend_, s.type, s.layout.padded_numel, mem_category::gathered_params,
                                 streams_.on(stream_role::gather));
    s.set_index = gathered_set_.size();
    gathered_set_.push_back(p);
    resident_numel_ += s.layout.padded_numel;
  }
  // Compute waits for p's gather (once): before a scope hands p out, and before freeing it.
  void await_gather(param_id p) {
    auto& s = slots_[p];
    streams_.wait_for(stream_role::compute, s.gather_done);
    s.gather_done = {};
  }

  // Frees p's gathered buffer in the compute stream's order, after its gather (which compute
  // may not have waited for yet: a parameter gathered ahead can be evicted unused).
  void release_gathered(param_id p) {
    auto& s = slots_[p];
    if (!s.gathered) return;
    await_gather(p);
    s.gathered.reset_on(streams_.on(stream_role::compute));
    const param_id last = gathered_set_.back();  // O(1) removal: the last entry takes p's place
    gathered_set_[s.set_index] = last;
    slots_[last].set_index = s.set_index;
    gathered_set_.pop_back();
    resident_numel_ -= s.layout.padded_numel;
  }
  const std::vector<param_id>& gathered_set() const noexcept { return gathered_set_; }

  std::size_t resident_numel() const noexcept { return resident_numel_; }

 private:
  Backend& backend_;
  const model_spec& spec_;
  stream_roles<Backend> streams_;
  std::vector<param_slot<Backend>> slots_;
  std::vector<param_id> gathered_set_;
  std::size_t resident_numel_ = 0;  // sum of padded_numel over gathered_set_
};

}  // namespace zshard

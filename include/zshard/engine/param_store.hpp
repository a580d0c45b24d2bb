#pragma once
// Per-rank storage of every parameter: its layout, its working shard, and — while in use — its
// gathered full value and its full gradient. The store owns the buffers; policies decide when
// they come and go. Resident gathered elements are derived from the set of gathered
// parameters on every query (invariant I5), never kept as a free-running counter.
#include <algorithm>
#include <vector>

#include "zshard/core/buffer.hpp"
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

  // Gathered but neither in use nor held: may be released to make room.
  bool evictable() const noexcept { return gathered && pins == 0 && holds == 0; }

  bool is_gathered() const noexcept { return layout.replicated || static_cast<bool>(gathered); }
  // The full (unpadded) value, valid while gathered.
  void* full_data() const noexcept { return layout.replicated ? shard.data() : gathered.data(); }
};

template <class Backend>
class param_store {
 public:
  param_store(Backend& backend, const model_spec& spec, std::vector<shard_layout> layouts, dtype default_type)
      : backend_(backend), spec_(spec) {
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
  std::size_t size() const noexcept { return slots_.size(); }
  param_slot<Backend>& operator[](param_id p) noexcept { return slots_[p]; }
  const param_slot<Backend>& operator[](param_id p) const noexcept { return slots_[p]; }

  // Allocates the gathered buffer and records p as resident; the caller fills it.
  void mark_gathered(param_id p) {
    auto& s = slots_[p];
    s.gathered = buffer<Backend>(backend_, s.type, s.layout.padded_numel, mem_category::gathered_params);
    gathered_set_.push_back(p);
  }
  void release_gathered(param_id p) noexcept {
    slots_[p].gathered.reset();
    auto it = std::find(gathered_set_.begin(), gathered_set_.end(), p);
    if (it != gathered_set_.end()) {
      *it = gathered_set_.back();
      gathered_set_.pop_back();
    }
  }
  const std::vector<param_id>& gathered_set() const noexcept { return gathered_set_; }

  // I5: derived from the set, not counted.
  std::size_t resident_numel() const noexcept {
    std::size_t n = 0;
    for (param_id p : gathered_set_) n += slots_[p].layout.padded_numel;
    return n;
  }

 private:
  Backend& backend_;
  const model_spec& spec_;
  std::vector<param_slot<Backend>> slots_;
  std::vector<param_id> gathered_set_;
};

}  // namespace zshard

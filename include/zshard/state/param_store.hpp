#pragma once
// Per-rank state of every parameter that the engine and its policies share: its layout, its
// working shard, its state (sharded / gathering / gathered) with the gathered full value, its
// full gradient while backward accumulates, and the role streams that order work on them
// (stream_roles.hpp). The store owns the buffers; policies decide when they come and go.
//
// What is gathered changes only through the engine's residency (engine/residency.hpp), which
// proves it with a residency_key: a Reducer or Offloader sees shards, gradients and streams but
// cannot gather or release, so it cannot break I5. Resident gathered elements move only
// together with the set of gathered parameters — in the transitions below — so the figure
// cannot drift from the set or be reset on its own; the engine cross-checks it against the
// gathered buffers (and the ledger's gathered bytes) at every micro-batch and step boundary.
//
// The state of a sharded (not replicated) parameter, as FSDP2 names them, asserted at each
// transition:
//   sharded    --begin_gather-->  gathering   the gathered buffer exists, its all-gather is
//                                             enqueued on the gather stream
//   gathering  --finish_gather--> gathered    compute has waited for the gather: readable
//   gathering | gathered --release--> sharded
// A replicated parameter is always gathered (its shard is the whole value) and never moves.
//
// Offloaded shards (parameter offload, state/shard_tier.hpp): built with offload_shards, the
// store allocates no device shard for a sharded parameter (`shard` stays empty); the Offloader
// attaches the tier that keeps it, and a gather reads gather_source(p, role), a copy staged for
// it. Code that reads or writes a working shard goes through host_shard(p) first.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/enum_name.hpp"
#include "zshard/core/param_table.hpp"
#include "zshard/core/error.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/shard_layout.hpp"
#include "zshard/state/shard_tier.hpp"
#include "zshard/state/stream_roles.hpp"

namespace zshard {

enum class param_state : std::uint8_t { sharded, gathering, gathered };

constexpr std::string_view to_string(param_state s) noexcept {
  return enum_name(s, {{param_state::sharded, "sharded"}, {param_state::gathering, "gathering"},
                       {param_state::gathered, "gathered"}});
}

template <class Backend, class Comm, class Prefetcher>
class residency;

// Only the engine's residency may change what is gathered; the key is its proof.
class residency_key {
  template <class, class, class>
  friend class residency;
  residency_key() = default;
};

template <class Backend>
class param_store;

template <class Backend>
class param_slot {
 public:
  const param_spec* spec = nullptr;
  shard_layout layout{};
  dtype type = dtype::f32;    // working dtype
  buffer<Backend> shard;      // this rank's slice (whole value when replicated); empty when offloaded
  buffer<Backend> full_grad;  // f32, padded, while backward accumulates into it

  param_state state() const noexcept { return state_; }
  bool is_gathered() const noexcept { return state_ != param_state::sharded; }
  // The padded full value while gathering or gathered (empty otherwise, and for replicated).
  const buffer<Backend>& gathered() const noexcept { return gathered_; }
  // The full (unpadded) value: readable in state gathered only.
  void* full_data() const {
    ZSHARD_REQUIRE(state_ == param_state::gathered, error_kind::invariant,
                   "parameter '" + spec->name + "' read while " + std::string(to_string(state_)));
    return layout.replicated ? shard.data() : gathered_.data();
  }

 private:
  friend class param_store<Backend>;
  buffer<Backend> gathered_;  // padded full value while gathering or gathered (never for replicated)
  param_state state_ = param_state::sharded;
  std::size_t set_index_ = 0;  // position in the store's gathered set while gathering or gathered
};

template <class Backend>
class param_store {
 public:
  param_store(Backend& backend, const model_spec& spec, const std::vector<shard_layout>& layouts, dtype default_type,
              bool overlap = false, const typename Backend::stream* compute = nullptr, bool offload_shards = false)
      : backend_(backend), spec_(spec), streams_(backend, overlap, compute), offload_shards_(offload_shards) {
    slots_.resize(spec.params().size());
    for (std::size_t p = 0; p < slots_.size(); ++p) {
      auto& s = slots_[p];
      s.spec = &spec.params()[p];
      s.layout = layouts[p];
      s.type = s.spec->type.value_or(default_type);
      if (offloaded(p)) continue;  // its tier keeps it
      s.shard = buffer<Backend>(backend, s.type, s.layout.shard_numel, mem_category::sharded_params,
                                streams_.on(stream_role::compute));
      if (s.layout.replicated) s.state_ = param_state::gathered;
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

  // ---- offloaded shards (state/shard_tier.hpp) -------------------------------------------------
  // Whether p's working shard lives in a tier off the device (sharded parameters only).
  bool offloaded(param_id p) const noexcept { return offload_shards_ && !slots_[p].layout.replicated; }
  bool offloads_shards() const noexcept { return offload_shards_; }
  // The Offloader that keeps offloaded shards attaches its tier at construction (once).
  void attach_tier(shard_tier<Backend>& t) noexcept { tier_ = &t; }
  bool has_tier() const noexcept { return tier_ != nullptr; }
  // p's working shard in host memory the CPU may read and write, when offloaded (null when it is
  // on the device, and on a backend that holds no storage).
  void* host_shard(param_id p) const noexcept { return offloaded(p) && tier_ ? tier_->host_shard(p) : nullptr; }
  // What a collective enqueued next on `consumer`'s stream reads as p's shard: the device shard,
  // or a copy of the offloaded one staged for it (freed by gathers_issued).
  const void* gather_source(param_id p, stream_role consumer) {
    if (!offloaded(p)) return slots_[p].shard.data();
    ZSHARD_REQUIRE(tier_ != nullptr, error_kind::invariant,
                   "parameter '" + slots_[p].spec->name + "' is offloaded but no tier keeps it");
    return tier_->stage(p, consumer);
  }
  // The collectives reading the copies staged for `consumer` have been issued.
  void gathers_issued(stream_role consumer) noexcept {
    if (tier_) tier_->unstage(consumer);
  }
  // The host waits for uploads in flight before it writes offloaded shards.
  void quiesce_tier() {
    if (tier_) tier_->quiesce();
  }

  // sharded -> gathering: allocates the gathered buffer and records p as resident; returns the
  // buffer, which the caller fills on the gather stream after making it wait for compute. The
  // buffer is allocated in the compute stream's order, where it is also freed (release), so a
  // stream-ordered pool reuses it at once for the next gather: allocated on the gather stream, a
  // block freed on compute could be reused there only once the pool saw the free complete, and
  // with the host running ahead the pool grew instead (20-27% above the ledger, issue 24).
  void* begin_gather(param_id p, residency_key) {
    auto& s = slots_[p];
    expect(s, param_state::sharded, "begin_gather");
    s.gathered_ = buffer<Backend>(backend_, s.type, s.layout.padded_numel, mem_category::gathered_params,
                                  streams_.on(stream_role::compute));
    s.state_ = param_state::gathering;
    s.set_index_ = gathered_set_.size();
    gathered_set_.push_back(p);
    resident_numel_ += s.layout.padded_numel;
    return s.gathered_.data();
  }

  // gathering -> gathered: compute has waited for p's gather.
  void finish_gather(param_id p, residency_key) {
    auto& s = slots_[p];
    expect(s, param_state::gathering, "finish_gather");
    s.state_ = param_state::gathered;
  }

  // gathering | gathered -> sharded: frees the gathered buffer in the compute stream's order
  // (the caller has made compute wait for the gather).
  void release(param_id p, residency_key) {
    auto& s = slots_[p];
    if (s.layout.replicated || s.state_ == param_state::sharded) [[unlikely]]
      throw_bad_transition(s, "release");
    s.gathered_.reset_on(streams_.on(stream_role::compute));
    leave_gathered_set(p);
  }

  // gathering -> sharded when p's all-gather failed to be issued: frees the gathered buffer in
  // the gather stream's order, which any part of the failed collective was enqueued on and which
  // waited for the buffer's allocation on compute (residency::gather_group).
  void abandon_gather(param_id p, residency_key) {
    auto& s = slots_[p];
    expect(s, param_state::gathering, "abandon_gather");
    s.gathered_.reset_on(streams_.on(stream_role::gather));
    leave_gathered_set(p);
  }

  // Parameters gathering or gathered (replicated ones excluded: they are never in the set).
  const std::vector<param_id>& gathered_set() const noexcept { return gathered_set_; }
  std::size_t resident_numel() const noexcept { return resident_numel_; }

  // The identity of the collectives issued now (the engine sets it as each scope opens): a
  // policy that communicates tags its collectives with tag_for(p, use), so ranks that reduce
  // different parameters fail instead of mixing them (comm/communicator.hpp, tags_collectives).
  collective_tag collective_context{};
  collective_tag tag_for(param_id p, collective_use use) const noexcept {
    collective_tag t = collective_context;
    t.param = p;
    t.use = use;
    return t;
  }

 private:
  void leave_gathered_set(param_id p) noexcept {
    auto& s = slots_[p];
    s.state_ = param_state::sharded;
    const param_id last = gathered_set_.back();  // O(1) removal: the last entry takes p's place
    gathered_set_[s.set_index_] = last;
    slots_[last].set_index_ = s.set_index_;
    gathered_set_.pop_back();
    resident_numel_ -= s.layout.padded_numel;
  }

  // Inline check, out-of-line message: every gather and release passes here.
  static void expect(const param_slot<Backend>& s, param_state want, const char* transition) {
    if (s.layout.replicated || s.state_ != want) [[unlikely]]
      throw_bad_transition(s, transition);
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void throw_bad_transition(const param_slot<Backend>& s,
                                                                          const char* transition) {
    throw error(error_kind::invariant, std::string(transition) + " of parameter '" + s.spec->name + "' in state " +
                                           std::string(to_string(s.state_)) +
                                           (s.layout.replicated ? " (replicated)" : ""));
  }

  Backend& backend_;
  const model_spec& spec_;
  stream_roles<Backend> streams_;
  param_table<param_slot<Backend>> slots_;
  std::vector<param_id> gathered_set_;
  std::size_t resident_numel_ = 0;  // sum of padded_numel over gathered_set_
  bool offload_shards_ = false;
  shard_tier<Backend>* tier_ = nullptr;  // owned by the Offloader, which the engine destroys first
};

}  // namespace zshard

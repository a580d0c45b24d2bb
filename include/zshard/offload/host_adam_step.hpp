#pragma once
// The host Offloader's AdamW step: tiles updated in host memory, through staging, or from NVMe chunks.
#include <cstddef>
#include <cstring>

#include "zshard/core/dtype.hpp"
#include "zshard/offload/nvme_state.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/optim/adamw_dispatch.hpp"
#include "zshard/state/param_store.hpp"

namespace zshard::offload {

template <class Backend, class Comm>
class host_adam_impl;

template <class Backend, class Comm>
class host_adam_step {
  using impl = host_adam_impl<Backend, Comm>;

 public:
  static void update(impl& o, const update_args& a) {
    o.drain();
    optim::adamw_config hyper = o.hyper_;
    hyper.lr = a.lr;
    o.step_now_ = a.step;
    o.groups_ = a.groups;
    if (o.groups_) {
      o.groups_->steps(o.hyper_, a.step, a.grad_scale, o.steps_);
    } else {
      o.steps_.resize(2);
      o.steps_[0] = optim::make_adamw_step(hyper, a.step, a.grad_scale, false);
      o.steps_[1] = optim::make_adamw_step(hyper, a.step, a.grad_scale, true);
    }
    // Each parameter's own step count: a parameter without a gradient this step is skipped (as
    // PyTorch does) unless update_params_without_grad, and its count stays.
    for (param_id p = 0; p < o.steps_before_.size(); ++p)
      o.steps_before_[p] = o.params_[p].steps;  // NVMe: a failed step
    for (param_id p = 0; p < o.params_.size(); ++p) {
      auto& ps = o.params_[p];
      if (ps.trainable && !o.writes_host(p)) o.moved_.to_device += ps.numel * size_of(o.store_[p].type);  // staged up
      ps.skip = ps.trainable && !ps.has_grad && !o.hyper_.update_params_without_grad;
      if (!ps.trainable || ps.skip) continue;
      ++ps.steps;
      if (ps.steps != a.step)
        ps.own_step = o.groups_ ? o.groups_->step_for(p, o.store_[p].spec->decay, o.hyper_, ps.steps, a.grad_scale)
                                : optim::make_adamw_step(hyper, ps.steps, a.grad_scale, o.store_[p].spec->decay);
    }
    if constexpr (impl::holds_storage) {
      for (const auto& ps : o.params_)  // with update_params_without_grad: AdamW decays and moves with a zero gradient
        if (ps.trainable && !ps.has_grad) std::memset(impl::f32(o.grad_) + ps.offset, 0, ps.numel * sizeof(float));
      if (o.tier_) o.tier_->quiesce();  // uploads of the old shards done before the CPU writes them
      if (o.nvme_) {
        update_chunks(o);
      } else {
        update_direct(o, 0, o.direct_.size(), in_memory(o));
        if constexpr (!impl::in_place) update_through_staging(o, 0, o.rounds_.size(), in_memory(o));
      }
    } else if (o.nvme_) {  // accounting only: the tier counts what a step reads and writes
      o.nvme_->update([](std::size_t, const chunk_view&) {}, [](std::size_t, const chunk_view&) {});
    }
    o.clear_grads();
  }

 private:
  using tile = typename impl::tile;
  using segment = typename impl::segment;
  using round = typename impl::round;

  static const optim::adamw_step& step_for(const impl& o, param_id p) noexcept {
    if (o.params_[p].steps != o.step_now_) return o.params_[p].own_step;
    const bool decay = o.store_[p].spec->decay;
    return o.steps_[o.groups_ ? o.groups_->slot(p, decay) : (decay ? 1 : 0)];
  }

  // The state a tile reads: the flat arrays, or the chunk of them in an NVMe chunk buffer.
  static chunk_view in_memory(const impl& o) noexcept {
    return {impl::f32(o.master_), impl::f32(o.m_), impl::f32(o.v_), 0};
  }

  static void update_tile(impl& o, const tile& t, void* out, const chunk_view& s) noexcept {
    const std::size_t at = t.offset - s.first;
    // Unchanged (or rolled back after a failed NVMe step): the working value is the master's,
    // rounded (written for the staging path).
    if (o.params_[t.p].skip || o.restoring_) {
      zshard::convert(s.master + at, dtype::f32, out, o.store_[t.p].type, t.len);
      return;
    }
    optim::adamw_update_on(o.path_, step_for(o, t.p), s.master + at, s.m + at, s.v + at, impl::f32(o.grad_) + t.offset,
                           t.len, out, o.store_[t.p].type, o.prefetch_);
  }

  static void* working_shard(const impl& o, param_id p) noexcept {
    return o.store_.offloaded(p) ? o.store_.host_shard(p) : o.store_[p].shard.data();
  }

  // Host memory: the working copy is written straight into the shard. Tiles direct_[begin, end).
  static void update_direct(impl& o, std::size_t begin, std::size_t end, const chunk_view& s) {
    auto body = [&](std::size_t i) {
      const tile& t = o.tiles_[o.direct_[begin + i]];
      update_tile(o, t, static_cast<char*>(working_shard(o, t.p)) + t.local * size_of(o.store_[t.p].type), s);
    };
    o.pool_.run(end - begin, body);
  }

  // NVMe: chunk by chunk as nvme_state reads them; a failed step is rolled back there (working
  // values) and here (update counts), and the gradients stay for discard_grads().
  static void update_chunks(impl& o) {
    auto run = [&](std::size_t k, const chunk_view& s) {
      update_direct(o, o.chunk_direct_[k], o.chunk_direct_[k + 1], s);
      if constexpr (!impl::in_place) update_through_staging(o, o.chunk_rounds_[k], o.chunk_rounds_[k + 1], s);
    };
    try {
      o.nvme_->update(run, [&](std::size_t k, const chunk_view& s) {
        o.restoring_ = true;
        run(k, s);
        o.restoring_ = false;
      });
    } catch (...) {
      o.restoring_ = false;
      for (param_id p = 0; p < o.params_.size(); ++p) o.params_[p].steps = o.steps_before_[p];
      throw;
    }
  }

  // Device memory: round r is updated into staging half r % 2 while round r - 1's copies to
  // the device run; before issuing round r's copies, wait for round r - 1's, which frees the
  // half that round r + 1 writes.
  static void update_through_staging(impl& o, std::size_t first, std::size_t last, const chunk_view& s) {
    Backend& b = o.store_.backend();
    for (std::size_t r = first; r < last; ++r) {
      const round& rd = o.rounds_[r];
      char* half = reinterpret_cast<char*>(impl::f32(o.staging_) + (r % 2) * o.staging_numel_);
      auto body = [&](std::size_t k) {
        const tile& t = o.tiles_[o.staged_[rd.tile_begin + k]];
        update_tile(o, t, half + t.staging_byte, s);
      };
      o.pool_.run(rd.tile_end - rd.tile_begin, body);
      b.synchronize(o.compute());
      for (std::size_t s = rd.segment_begin; s < rd.segment_end; ++s) {
        const segment& seg = o.segments_[s];
        auto& slot = o.store_[seg.p];
        const std::size_t w = size_of(slot.type);
        b.copy(static_cast<char*>(slot.shard.data()) + seg.local * w, half + seg.staging_byte, seg.len * w,
               o.compute());
      }
    }
    b.synchronize(o.compute());
  }
};

}  // namespace zshard::offload

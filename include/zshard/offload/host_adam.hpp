#pragma once
// The host Offloader (ZeRO-Offload): fp32 master parameters, AdamW moments and fp32 gradient
// shards live in host memory: the backend's page-locked memory and its ledger when it has one
// (cuda_backend::pinned(); the budget is then the backend's host budget) and
// offload_config::pin_memory is on, else the offloader's own ledger "host (offloaded optimizer
// state)" (host_memory.hpp). The update runs on the CPU with the vectorised multi-threaded AdamW
// (optim/adamw_dispatch.hpp), and the updated working shards (f32/bf16/f16) go back to the
// backend, which then holds only working shards, gathered parameters and gradient buckets.
// The tiers beyond (docs/DESIGN.md, "offload tiers"; offload_config): with params = host the
// working shards of sharded parameters live in the same host memory (param_tier.hpp) and the
// update writes them there; with optimizer_state = nvme master, m and v live in files and the
// update runs chunk by chunk as they are read (nvme_state.hpp). The plan of the work (layout,
// tiles, staging rounds, chunks) is host_layout.hpp.
//
// What runs when, and what overlaps:
//  - During backward, each reduced gradient shard arrives as soon as its bucket is reduced
//    (accumulate_grad). Its sum of squares and Inf/NaN flag are computed in the same pass that
//    accumulates it, tile by tile, so step() needs no extra pass over the gradients for the
//    global norm and the overflow check. The first arrival in a step is copied, not added,
//    and nothing is ever zeroed: a per-parameter flag says whether the gradient holds data.
//    * Device memory (CUDA): the rank thread only enqueues each shard's copy to the host on the
//      reduce stream and records an event after it; it never waits for the reduce stream (which
//      waits for backward's kernels), so it goes straight back to enqueueing the next module.
//      The pool's helper threads wait for the event and accumulate, one queued chunk after
//      another. A first arrival is copied straight into the gradient shard (nothing to add);
//      later ones go through two page-locked staging halves, and only when both halves still
//      wait for their copies does the rank thread wait (polling, through the backend's watch).
//      Accumulation and statistics run behind the rest of backward; step() drains the queue.
//    * Host memory (host backend): the reducer frees the shard as soon as this call returns,
//      and a copy to keep it would cost as much as the add, so the add runs now, split over
//      the pool in tiles.
//  - The update itself cannot start before step(): with clipping it needs the global norm,
//    and with loss scaling the all-ranks overflow decision, which exist only when every rank
//    has finished backward. At step() all threads run AdamW tile by tile and write the working
//    copy in the same pass: into the backend's shard directly when that is host memory,
//    otherwise into a staging half whose device copy runs while the next round of tiles is
//    updated (double buffering).
//  - Holds no storage (phantom backend): every array is accounted in the host ledger with its
//    real size and no memory is touched, so simulated models report host memory per rank.
//
// Threads: offload_config::host_threads (engine_config::offload), else one per hardware thread.
//
// Freezing (set_trainable, between steps): a frozen parameter keeps its state (and its update
// count) in the flat arrays and gets no tiles, so no update touches it. Unfreezing one that
// never trained appends its state at the end of the flat arrays (existing offsets do not move),
// one array at a time: the host holds the state plus one array's copy for the moment, and a
// failed allocation leaves the previous state intact.
#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/checked_size.hpp"
#include "zshard/core/worker_pool.hpp"
#include "zshard/offload/host_adam_step.hpp"
#include "zshard/offload/host_layout.hpp"
#include "zshard/offload/host_memory.hpp"
#include "zshard/offload/landing_queue.hpp"
#include "zshard/offload/nvme_state.hpp"
#include "zshard/offload/offload_config.hpp"
#include "zshard/offload/offloader.hpp"
#include "zshard/offload/param_tier.hpp"
#include "zshard/optim/adamw_dispatch.hpp"
#include "zshard/optim/grad_clip.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard::offload {

template <class Backend, class Comm>
class host_adam_impl : private host_layout<Backend> {
  using layout = host_layout<Backend>;
  using typename layout::param_state;
  using typename layout::tile;
  using typename layout::segment;
  using typename layout::round;
  using layout::store_, layout::tile_, layout::staging_numel_, layout::nvme_chunk_, layout::params_, layout::tiles_,
      layout::direct_, layout::staged_, layout::segments_, layout::rounds_, layout::chunk_direct_,
      layout::chunk_rounds_, layout::by_offset_, layout::total_numel_;
  static constexpr bool holds_storage = Backend::holds_storage;
  static constexpr bool in_place = holds_storage && memory_is_host<Backend>();  // backend memory is host memory
  // One resource for everything kept on the host: the backend's page-locked memory when it has
  // some and offload_config::pin_memory says so, else own_memory_ (pageable).
  using resource_type =
      std::conditional_t<has_pinned_memory<Backend>, pinned_or_pageable<host_resource_t<Backend>>, host_memory>;
  using memory_holder = std::conditional_t<has_pinned_memory<Backend>, resource_type, resource_type&>;

 public:
  static constexpr bool applies_param_groups = true;  // update_args::groups
  host_adam_impl(param_store<Backend>& store, Comm& comm, const optim::adamw_config& hyper,
                 const offload_config& oc)
      : layout(store, optim::round_up_to_granule(oc.host_tile_numel), optim::round_up_to_granule(oc.host_staging_numel),
               oc.optimizer_state == offload_tier::nvme ? oc.nvme_chunk_numel : 0, holds_storage, in_place),
        comm_(comm),
        hyper_(hyper),
        oc_(validated(oc)),
        own_memory_("host (offloaded optimizer state)", oc_.host_budget_bytes, holds_storage),
        memory_(pick_memory()),
        path_(optim::resolve(oc_.host_path)),
        prefetch_(optim::adamw_prefetch_bytes()),
        landing_(*this, store.backend(), pool_),
        pool_(holds_storage ? oc_.host_threads : 1) {
    if (oc_.params == offload_tier::host) tier_.emplace(store, memory_);  // parameter offload (param_tier.hpp)
    layout::plan();
    tile_stats_.assign(tiles_.size(), grad_stats{});
    if (nvme_chunk_) {  // master, m, v in files (nvme_state.hpp); m and v start as the file's zeros
      nvme_.emplace(oc_, "r" + std::to_string(comm.rank()), total_numel_, memory_, holds_storage);
      steps_before_.resize(params_.size());
    } else {
      master_ = buffer<resource_type>(memory_, dtype::f32, total_numel_, mem_category::optimizer_state);
      m_ = buffer<resource_type>(memory_, dtype::f32, total_numel_, mem_category::optimizer_state);
      v_ = buffer<resource_type>(memory_, dtype::f32, total_numel_, mem_category::optimizer_state);
    }
    grad_ = buffer<resource_type>(memory_, dtype::f32, total_numel_, mem_category::grad_shards);
    if constexpr (holds_storage && !in_place) {
      staging_ = buffer<resource_type>(memory_, dtype::f32, 2 * staging_numel_, mem_category::scratch);
      landing_.start();
    }
    if constexpr (holds_storage) {
      if (total_numel_ > 0 && !nvme_) {
        std::memset(m_.data(), 0, m_.bytes());
        std::memset(v_.data(), 0, v_.bytes());
      }
    }
  }
  host_adam_impl(const host_adam_impl&) = delete;
  host_adam_impl& operator=(const host_adam_impl&) = delete;
  // Helpers still waiting for a copy that will never land (a failed collective ahead of it) give
  // up at once: the pool joins them next.
  ~host_adam_impl() { landing_.stop(); }

  void init_param(param_id p, const float* values) {
    const auto& ps = trainable_state(p);
    if constexpr (holds_storage) {
      if (nvme_) {  // to the file through host memory (construction only)
        std::vector<float> host(ps.numel);
        store_.backend().copy(host.data(), values, ps.numel * sizeof(float), compute());
        store_.backend().synchronize(compute());
        return nvme_->write(0, ps.offset, host.data(), ps.numel);
      }
      store_.backend().copy(f32(master_) + ps.offset, values, ps.numel * sizeof(float), compute());
      store_.backend().synchronize(compute());
    }
  }

  void accumulate_grad(param_id p, const float* g, std::size_t n, typename Backend::stream& ready_on) {
    auto& ps = trainable_state(p);
    if (n != ps.numel)  // a branch, not ZSHARD_REQUIRE(): the message is built only on failure (no per-step allocation)
      throw error(error_kind::invariant, "host_adam: gradient of parameter '" + store_[p].spec->name + "' has " +
                                             std::to_string(n) + " elements, its shard " + std::to_string(ps.numel));
    const bool first = !ps.has_grad;
    ps.has_grad = true;
    if constexpr (!memory_is_host<Backend>()) moved_.to_host += n * sizeof(float);
    if constexpr (in_place) {
      store_.backend().synchronize(ready_on);  // the CPU reads g: it must be complete
      accumulate_in_place(ps, g, first);
    }
    else if constexpr (holds_storage)
      stream_from_device(ps, g, first, ready_on);
  }

  // Chunks copied to the host and not yet accumulated (device path): what the rank thread left
  // to the helpers instead of waiting. Tests read it.
  std::size_t queued_chunks() const noexcept { return landing_.size(); }

  // Over the gradients this rank owns; the sums were taken as the gradients arrived.
  grad_stats local_grad_stats() {
    drain();
    grad_stats total;
    for (param_id p = 0; p < params_.size(); ++p) {
      const auto& ps = params_[p];
      if (!ps.has_grad) continue;                                      // no gradient arrived: it is zero
      if (store_[p].layout.replicated && comm_.rank() != 0) continue;  // count replicated values once
      for (std::size_t k = 0; k < ps.tile_count; ++k) total += tile_stats_[ps.first_tile + k];
    }
    return total;
  }

  // The AdamW step over this rank's shards (offload/host_adam_step.hpp).
  void update(const update_args& a) { host_adam_step<Backend, Comm>::update(*this, a); }

  // Each parameter's own update count (its AdamW bias correction), by param_id: a parameter
  // skipped in a step (no gradient) lags the engine's step. Checkpoints save and restore them
  // (checkpoint/manifest.hpp); set_update_counts(steps) is the fallback for a checkpoint that
  // has none: every parameter continues from the engine's count.
  std::vector<std::int64_t> update_counts() const {
    std::vector<std::int64_t> out;
    out.reserve(params_.size());
    for (const auto& st : params_) out.push_back(st.steps);
    return out;
  }
  void set_update_counts(std::span<const std::int64_t> counts) {
    ZSHARD_REQUIRE(counts.size() == params_.size(), error_kind::usage,
                   std::to_string(counts.size()) + " update counts for " + std::to_string(params_.size()) + " parameters");
    for (std::size_t p = 0; p < counts.size(); ++p) params_[p].steps = counts[p];
  }
  void set_update_counts(std::int64_t steps) {
    for (auto& st : params_) st.steps = steps;
  }

  void discard_grads() {
    drain();
    clear_grads();
  }

  const memory_ledger& state_ledger() const noexcept { return memory_.ledger(); }

  // The fp32 master shard of p on the host (empty for parameters without state, phantom backends
  // and state on NVMe: read_state reads it there).
  std::span<const float> master(param_id p) const noexcept {
    const auto& ps = params_[p];
    if (!ps.has_state || master_.data() == nullptr) return {};
    return {f32(master_) + ps.offset, ps.numel};
  }

  // L1 / L-inf part over the gradients this rank owns (optim/grad_clip.hpp, engine/grad_norm.hpp),
  // straight from the host array; a parameter no gradient reached counts as zero.
  double local_grad_norm_part(double norm_type) {
    drain();
    double part = 0.0;
    if constexpr (holds_storage) {
      for (param_id p = 0; p < params_.size(); ++p) {
        const auto& ps = params_[p];
        if (!ps.trainable || !ps.has_grad) continue;
        if (norm_type == 1.0 && store_[p].layout.replicated && comm_.rank() != 0) continue;
        part =
            optim::combine_norm_parts(part, optim::norm_part(f32(grad_) + ps.offset, ps.numel, norm_type), norm_type);
      }
    }
    return part;
  }

  // p's accumulated gradient shard (shard_numel f32) into host memory (zeros when none arrived).
  void read_grad(param_id p, float* dst) {
    drain();
    const auto& ps = trainable_state(p);
    if constexpr (holds_storage) {
      if (ps.has_grad)
        std::memcpy(dst, f32(grad_) + ps.offset, ps.numel * sizeof(float));
      else
        std::memset(dst, 0, ps.numel * sizeof(float));
    }
  }

  // Between steps (no gradient pending). See the header comment for what happens to the state.
  void set_trainable(param_id p, bool trainable) {
    drain();
    auto& ps = params_.at(p);
    ZSHARD_REQUIRE(!(trainable && !ps.has_state && nvme_), error_kind::usage,
                   "parameter '" + store_[p].spec->name + "' never trained: its optimizer state has no room in the "
                       "NVMe state files, which were sized at construction",
                   "construct the engine with the parameter trainable (then freeze it before the first step)");
    if (trainable && !ps.has_state) add_state(p);
    ps.trainable = trainable;
    layout::plan_tiles();
    tile_stats_.assign(tiles_.size(), grad_stats{});
  }
  // Whether p has optimizer state: trainable now, or frozen with the state it kept (checkpoints
  // save it); and whether a parameter without any can be given it (not on NVMe, whose state files
  // were sized at construction).
  bool has_state(param_id p) const noexcept { return p < params_.size() && params_[p].has_state; }
  bool can_add_state(param_id p) const noexcept { return has_state(p) || !nvme_; }
  // State access (state/state_access.hpp): straight from and into the host arrays, no device
  // round trip. Waits for the pool first (a gradient still being accumulated).
  void read_state(param_id p, state_field f, std::size_t offset, float* dst, std::size_t n) {
    pool_.wait();
    const float* src = field(p, f, offset, n);
    if (nvme_) return nvme_->read(field_index(f), params_[p].offset + offset, dst, n);
    if (n && src) std::memcpy(dst, src, n * sizeof(float));
  }
  // p's field in the host arrays (null on a phantom backend, and for state on NVMe).
  float* state_host_data(param_id p, state_field f) {
    pool_.wait();
    float* data = field(p, f, 0, 0);
    return nvme_ ? nullptr : data;
  }
  void write_state(param_id p, state_field f, std::size_t offset, const float* src, std::size_t n) {
    pool_.wait();
    float* dst = field(p, f, offset, n);
    if (nvme_) return nvme_->write(field_index(f), params_[p].offset + offset, src, n);
    if (n && dst) std::memcpy(dst, src, n * sizeof(float));
  }
  // The NVMe tier (offload_config::optimizer_state = nvme), else null: its files' ledger, its file.
  const nvme_state<resource_type>* nvme() const noexcept { return nvme_ ? &*nvme_ : nullptr; }
  const offload_config& config() const noexcept { return oc_; }
  // Bytes of offloaded parameter shards uploaded for gathers so far (0 without parameter offload).
  std::uint64_t uploaded_bytes() const noexcept { return tier_ ? tier_->uploaded_bytes() : 0; }
  // Bytes moved between tiers so far (offload_config.hpp), as the planner counts them per step
  // (memory_plan::moved); on a backend without storage, what a device run would move.
  tier_traffic traffic() const noexcept {
    tier_traffic t = moved_;
    t.to_device += uploaded_bytes();
    if (nvme_) {
      t.disk_read = nvme_->step_bytes_read();
      t.disk_written = nvme_->step_bytes_written();
    }
    return t;
  }
  optim::simd_path path() const noexcept { return path_; }
  int threads() const noexcept { return pool_.size(); }

 private:
  friend class landing_queue<Backend, host_adam_impl>;
  friend class host_adam_step<Backend, Comm>;

  static float* f32(const buffer<resource_type>& b) noexcept { return b.template as<float>(); }

  memory_holder pick_memory() noexcept {
    if constexpr (has_pinned_memory<Backend>)
      return resource_type(oc_.pin_memory ? &store_.backend().pinned() : nullptr, own_memory_);
    else
      return own_memory_;
  }

  static offload_config validated(const offload_config& oc) {
    oc.validate();
    return oc;
  }

  // Null when the backend holds no storage (phantom).
  float* field(param_id p, state_field f, std::size_t offset, std::size_t n) {
    ZSHARD_REQUIRE(p < params_.size() && params_[p].has_state, error_kind::usage,
                   "parameter #" + std::to_string(p) + " has no optimizer state (frozen or out of range)");
    const param_state& ps = params_[p];
    ZSHARD_REQUIRE(f != state_field::working && range_within(offset, n, ps.numel), error_kind::usage,
                   "state access of " + std::string(to_string(f)) + ": " + describe_range(offset, n) +
                       " of a shard of " + std::to_string(ps.numel));
    const auto& b = f == state_field::master ? master_ : f == state_field::m ? m_ : v_;
    return b.data() ? f32(b) + ps.offset + offset : nullptr;
  }

  static int field_index(state_field f) noexcept { return f == state_field::master ? 0 : f == state_field::m ? 1 : 2; }

  param_state& trainable_state(param_id p) {
    if (p >= params_.size() || !params_[p].trainable)
      throw error(error_kind::usage, "host_adam: parameter #" + std::to_string(p) + " is not a trainable parameter",
                  "frozen parameters have no optimizer state and receive no gradient");
    return params_[p];
  }

  // Appends p's state to the flat arrays (see the header comment); its master comes from the
  // working shard, its moments are zero, its update count 0.
  void add_state(param_id p) {
    const std::size_t n = store_[p].layout.shard_numel, offset = total_numel_;
    const std::size_t total = offset + optim::round_up_to_granule(n);
    auto grow = [&](buffer<resource_type>& b, mem_category c) {
      if (b.numel() == total) return;  // grown by an earlier attempt that failed later
      buffer<resource_type> next(memory_, dtype::f32, total, c);
      if constexpr (holds_storage) {
        if (b.numel() > 0) std::memcpy(next.data(), b.data(), b.bytes());
        std::memset(f32(next) + b.numel(), 0, (total - b.numel()) * sizeof(float));
      }
      b = std::move(next);
    };
    grow(master_, mem_category::optimizer_state);
    grow(m_, mem_category::optimizer_state);
    grow(v_, mem_category::optimizer_state);
    grow(grad_, mem_category::grad_shards);
    if constexpr (holds_storage) {
      Backend& b = store_.backend();
      const auto& slot = store_[p];
      if (const void* host = store_.host_shard(p)) {  // offloaded: already in host memory
        zshard::convert(host, slot.type, f32(master_) + offset, dtype::f32, n);
      } else {
        buffer<Backend> staging(b, dtype::f32, n, mem_category::scratch, compute());
        b.convert(slot.shard.data(), slot.type, staging.data(), dtype::f32, n, compute());
        b.copy(f32(master_) + offset, staging.data(), n * sizeof(float), compute());
        b.synchronize(compute());
      }
    }
    layout::append(p);
  }

  // dst (+)= src over one tile, then the tile's sum of squares and Inf/NaN flag while it is in cache.
  static void accumulate_tile(float* dst, const float* src, std::size_t n, bool first, grad_stats& out) noexcept {
    if (first) {
      if (dst != src) std::memcpy(dst, src, n * sizeof(float));  // a first arrival may have landed in place
    } else {
      for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
    }
    optim::norm_accumulator acc;
    acc.add(dst, n, 1.0f);
    out = {acc.sum_squares, acc.nonfinite};
  }

  void accumulate_in_place(const param_state& ps, const float* g, bool first) {
    auto body = [&](std::size_t k) {
      const tile& t = tiles_[ps.first_tile + k];
      accumulate_tile(f32(grad_) + t.offset, g + t.local, t.len, first, tile_stats_[ps.first_tile + k]);
    };
    pool_.run(ps.tile_count, body);
  }

  // Enqueues the copies of g to the host on g's stream (after the reduction that produced it)
  // and queues their accumulation (landing_queue.hpp); never waits for the stream. A first
  // arrival lands straight in the gradient shard. Later ones go in chunks of whole tiles, each
  // at most one staging half, alternating halves; a half is reused once its chunk is added.
  void stream_from_device(const param_state& ps, const float* g, bool first, typename Backend::stream& ready_on) {
    Backend& b = store_.backend();
    if (first) {
      landing_.make_room();
      float* dst = f32(grad_) + ps.offset;
      b.copy(dst, g, ps.numel * sizeof(float), ready_on);
      return landing_.push({ps.first_tile, ps.tile_count, 0, dst, true, -1, 0}, ready_on);
    }
    for (std::size_t k = 0; k < ps.tile_count;) {
      const std::size_t base = tiles_[ps.first_tile + k].local;
      std::size_t e = k;
      while (e < ps.tile_count &&
             tiles_[ps.first_tile + e].local + tiles_[ps.first_tile + e].len - base <= staging_numel_)
        ++e;
      const tile& last = tiles_[ps.first_tile + e - 1];
      const int h = landing_.free_half();
      float* half = f32(staging_) + static_cast<std::size_t>(h) * staging_numel_;
      b.copy(half, g + base, (last.local + last.len - base) * sizeof(float), ready_on);
      landing_.push({ps.first_tile + k, e - k, base, half, false, h, 0}, ready_on);
      k = e;
    }
  }

  // Helper threads, once chunk c has landed: its tile k into the gradient shard, with stats.
  void accumulate_chunk_tile(const landing_chunk& c, std::size_t k) noexcept {
    const tile& t = tiles_[c.first_tile + k];
    accumulate_tile(f32(grad_) + t.offset, c.src + (t.local - c.base_local), t.len, c.first,
                    tile_stats_[c.first_tile + k]);
  }

  // Every queued copy accumulated (the step reads the gradients and their statistics).
  void drain() {
    if constexpr (holds_storage && !in_place) landing_.drain();
    pool_.wait();
  }

  void clear_grads() noexcept {
    for (auto& ps : params_) ps.has_grad = false;
  }

  // Init, update and gradient statistics run on the compute stream (see offloader.hpp).
  typename Backend::stream& compute() noexcept { return store_.streams().on(stream_role::compute); }

  Comm& comm_;
  const optim::adamw_config hyper_;
  const offload_config oc_;
  host_memory own_memory_;  // unused when the state is in the backend's page-locked memory
  memory_holder memory_;
  const optim::simd_path path_;
  const std::size_t prefetch_;  // the kernel's prefetch distance (adamw_prefetch.hpp), read once
  std::vector<grad_stats> tile_stats_;  // per tile, of the accumulated gradient
  std::vector<optim::adamw_step> steps_;  // [decay], or per (group, decay) slot with groups_
  const optim::param_groups* groups_ = nullptr;  // of the update running
  std::int64_t step_now_ = 0;     // the engine's step of the update running
  buffer<resource_type> master_, m_, v_, grad_, staging_;
  std::optional<param_tier<Backend, resource_type>> tier_;  // offloaded parameter shards (offload_config::params)
  std::optional<nvme_state<resource_type>> nvme_;          // master, m, v in files (offload_config::optimizer_state)
  std::vector<std::int64_t> steps_before_;                 // NVMe: update counts before the step, for a rollback
  tier_traffic moved_{};  // gradients down, working values up (uploads: tier_, disk: nvme_)
  bool restoring_ = false;                                 // NVMe: update_tile rounds masters only (rollback)
  landing_queue<Backend, host_adam_impl> landing_;  // the device path's copies to the host in flight
  worker_pool pool_;  // last: joined before anything its jobs touch is destroyed
};

struct host_adam {
  using zshard_tag = offloader_tag;
  template <class Backend, class Comm>
  using impl = host_adam_impl<Backend, Comm>;
};

}  // namespace zshard::offload

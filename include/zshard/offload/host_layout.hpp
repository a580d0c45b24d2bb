#pragma once
// The host Offloader's plan of its work (offload/host_adam.hpp): where each parameter's state
// sits in the flat f32 arrays (master, m, v, gradient; 32-element offsets), the tiles its work is
// split in, which tiles write working values straight to host memory (the host backend's
// shards, offloaded shards) and which go through the staging halves in rounds (a device's
// shards), and, with the state on NVMe (nvme_state.hpp), each chunk's tiles and rounds: tiles
// and rounds never cross a chunk. Planned once (and again after set_trainable), so no step
// allocates.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "zshard/core/param_table.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/adamw_dispatch.hpp"
#include "zshard/state/param_store.hpp"

namespace zshard::offload {

template <class Backend>
class host_layout {
 protected:
  struct param_state {
    bool trainable = false;        // updated by update(); has tiles
    bool has_state = false;        // has master, m, v, grad in the flat arrays (trainable now or before)
    bool has_grad = false;         // a gradient arrived since the last update/discard; else it is zero
    bool skip = false;             // this update leaves it alone (no gradient)
    std::int64_t steps = 0;        // updates applied to it (its AdamW bias correction)
    optim::adamw_step own_step{};  // when steps differs from the engine's step
    std::size_t offset = 0;        // first element in the flat host arrays (a multiple of 32)
    std::size_t numel = 0;         // shard elements
    std::size_t first_tile = 0;    // tiles_[first_tile, first_tile + tile_count)
    std::size_t tile_count = 0;
  };
  struct tile {
    param_id p;
    std::size_t offset;  // in the flat host arrays
    std::size_t local;   // in p's shard
    std::size_t len;
    std::size_t staging_byte;  // where its working values go in a staging half (device backends)
  };
  // A round of the device path: tiles updated into one staging half, then copied out as one
  // segment per parameter.
  struct segment {
    param_id p;
    std::size_t local, len, staging_byte;
  };
  struct round {
    std::size_t tile_begin, tile_end, segment_begin, segment_end;  // tiles: indices into staged_
  };

  // split: whether work is split at all (not on a backend without storage); host_working: the
  // backend's shards are host memory; chunk: NVMe chunk elements (0: state in memory).
  host_layout(param_store<Backend>& store, std::size_t tile, std::size_t staging_numel, std::size_t chunk, bool split,
              bool host_working)
      : store_(store),
        tile_(tile),
        staging_numel_(staging_numel),
        nvme_chunk_(chunk),
        split_(split),
        host_working_(host_working) {}

  // Flat layout of the trainable parameters, then their tiles.
  void plan() {
    params_.resize(store_.size());
    for (param_id p = 0; p < store_.size(); ++p) {
      const auto& slot = store_[p];
      if (!slot.spec->trainable) continue;
      auto& ps = params_[p];
      ps.trainable = ps.has_state = true;
      ps.offset = total_numel_;
      ps.numel = slot.layout.shard_numel;
      total_numel_ += optim::round_up_to_granule(ps.numel);
      by_offset_.push_back(p);
    }
    plan_tiles();
  }

  // p's state appended at the end of the flat arrays (existing offsets do not move), count 0.
  void append(param_id p) {
    auto& ps = params_[p];
    ps.has_state = true;
    ps.offset = total_numel_;
    ps.numel = store_[p].layout.shard_numel;
    ps.steps = 0;
    total_numel_ += optim::round_up_to_granule(ps.numel);
    by_offset_.push_back(p);
  }

  // Tiles of the trainable parameters in flat-array order, and the device path's rounds (again
  // after set_trainable, between steps: no chunk is in flight then).
  void plan_tiles() {
    tiles_.clear();
    direct_.clear();
    staged_.clear();
    segments_.clear();
    rounds_.clear();
    if (split_) {  // accounting only: no work is ever split
      for (param_id p : by_offset_) {
        auto& ps = params_[p];
        ps.first_tile = tiles_.size();
        if (ps.trainable)
          for (std::size_t b = 0, len = 0; b < ps.numel; b += len) {
            len = std::min(tile_, ps.numel - b);
            if (nvme_chunk_) len = std::min(len, nvme_chunk_ - (ps.offset + b) % nvme_chunk_);  // within a chunk
            tiles_.push_back({p, ps.offset + b, b, len, 0});
          }
        ps.tile_count = tiles_.size() - ps.first_tile;
        for (std::size_t i = ps.first_tile; i < tiles_.size(); ++i) (writes_host(p) ? direct_ : staged_).push_back(i);
      }
      if (!host_working_) plan_rounds();
    }
    if (nvme_chunk_) plan_chunks();
  }

  // Whether p's working shard is host memory the CPU writes directly: the backend's (host
  // memory), or an offloaded shard (param_tier.hpp).
  bool writes_host(param_id p) const noexcept { return host_working_ || store_.offloaded(p); }

  param_store<Backend>& store_;
  const std::size_t tile_, staging_numel_;
  const std::size_t nvme_chunk_;  // elements per NVMe chunk; 0: state in memory
  param_table<param_state> params_;
  std::vector<tile> tiles_;
  std::vector<std::size_t> direct_, staged_;  // tiles whose working values go straight to host memory / through staging
  std::vector<segment> segments_;
  std::vector<round> rounds_;
  std::vector<std::size_t> chunk_direct_, chunk_rounds_;  // NVMe: each chunk's tiles and rounds (plan_chunks)
  std::vector<param_id> by_offset_;                       // parameters with state, in flat-array order
  std::size_t total_numel_ = 0;

 private:
  // Rounds over the staged tiles (their indices in staged_, flat-array order), each within one
  // staging half and, with NVMe, one chunk.
  void plan_rounds() {
    for (std::size_t i = 0; i < staged_.size();) {
      round r{i, i, segments_.size(), segments_.size()};
      const std::size_t base = tiles_[staged_[i]].offset;
      while (r.tile_end < staged_.size() &&
             tiles_[staged_[r.tile_end]].offset + tiles_[staged_[r.tile_end]].len - base <= staging_numel_ &&
             same_chunk(tiles_[staged_[r.tile_end]].offset, base)) {
        tile& t = tiles_[staged_[r.tile_end]];
        const std::size_t w = size_of(store_[t.p].type);
        if (r.segment_end == r.segment_begin || segments_.back().p != t.p)
          segments_.push_back({t.p, t.local, 0, (t.offset - base) * sizeof(float)});
        segment& s = segments_.back();
        t.staging_byte = s.staging_byte + (t.local - s.local) * w;  // working values of a segment are contiguous
        s.len += t.len;
        r.segment_end = segments_.size();
        ++r.tile_end;
      }
      rounds_.push_back(r);
      i = r.tile_end;
    }
  }

  bool same_chunk(std::size_t a, std::size_t b) const noexcept {
    return nvme_chunk_ == 0 || a / nvme_chunk_ == b / nvme_chunk_;
  }
  // NVMe: chunk k's tiles are direct_[chunk_direct_[k], chunk_direct_[k + 1]) and its rounds
  // rounds_[chunk_rounds_[k], chunk_rounds_[k + 1]) (both lists are in flat-array order).
  void plan_chunks() {
    const std::size_t K = (total_numel_ + nvme_chunk_ - 1) / nvme_chunk_;
    chunk_direct_.assign(K + 1, direct_.size());
    chunk_rounds_.assign(K + 1, rounds_.size());
    for (std::size_t k = K, i = direct_.size(), r = rounds_.size(); k-- > 0;) {
      while (i > 0 && tiles_[direct_[i - 1]].offset / nvme_chunk_ >= k) --i;
      while (r > 0 && tiles_[staged_[rounds_[r - 1].tile_begin]].offset / nvme_chunk_ >= k) --r;
      chunk_direct_[k] = i;
      chunk_rounds_[k] = r;
    }
  }

  const bool split_, host_working_;
};

}  // namespace zshard::offload

#pragma once
// The engine's per-rank state access (state/state_access.hpp): elements [offset, offset + n) of
// field f of p's shard on this rank, to or from host memory (working: p's dtype; master, m, v:
// f32, parameters with optimizer state: trainable, or frozen with the state they kept; through
// the Offloader's read_state/write_state). Between
// steps only; a write of `working` takes effect at the next gather. Checkpoints, pretrained
// loading and the collective full-state calls (engine/full_state.hpp, state/param_access.hpp)
// are built on these.
#include <cstddef>
#include <cstring>
#include <string>

#include "zshard/core/checked_size.hpp"
#include "zshard/core/error.hpp"
#include "zshard/offload/host_memory.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard {

template <class Engine>
class shard_state {
  using backend_type = typename Engine::backend_type;
  using offloader_type = typename Engine::offloader_type;

 public:
  static void read(Engine& e, param_id p, state_field f, std::size_t offset, void* host_dst, std::size_t n) {
    auto& s = slot(e, p, f, offset, n);
    if (f != state_field::working) {
      if constexpr (state_accessible<offloader_type>)
        e.offloader_.read_state(p, f, offset, static_cast<float*>(host_dst), n);
      return;
    }
    if (const void* h = e.store_.host_shard(p)) {  // offloaded to host memory (param_store.hpp)
      if (n) std::memcpy(host_dst, static_cast<const char*>(h) + offset * size_of(s.type), n * size_of(s.type));
      return;
    }
    auto& compute = e.store_.streams().on(stream_role::compute);
    e.backend_.copy(host_dst, static_cast<const char*>(s.shard.data()) + offset * size_of(s.type),
                    n * size_of(s.type), compute);
    e.backend_.synchronize(compute);
  }

  static void write(Engine& e, param_id p, state_field f, std::size_t offset, const void* host_src, std::size_t n) {
    auto& s = slot(e, p, f, offset, n);
    if (f != state_field::working) {
      if constexpr (state_accessible<offloader_type>)
        e.offloader_.write_state(p, f, offset, static_cast<const float*>(host_src), n);
      return;
    }
    if (void* h = e.store_.host_shard(p)) {  // offloaded: the next gather uploads it
      e.store_.quiesce_tier();                // no upload of the old value still reads it
      if (n) std::memcpy(static_cast<char*>(h) + offset * size_of(s.type), host_src, n * size_of(s.type));
      return;
    }
    auto& compute = e.store_.streams().on(stream_role::compute);
    e.backend_.copy(static_cast<char*>(s.shard.data()) + offset * size_of(s.type), host_src, n * size_of(s.type),
                    compute);
    e.backend_.synchronize(compute);
    e.publish_shards();
  }

  static void* host_data(Engine& e, param_id p, state_field f) {
    auto& s = slot(e, p, f, 0, 0);
    if (f == state_field::working) {
      if (void* h = e.store_.host_shard(p)) {
        e.store_.quiesce_tier();  // the caller may write it
        return h;
      }
      return offload::memory_is_host<backend_type>() ? s.shard.data() : nullptr;
    }
    if constexpr (requires { e.offloader_.state_host_data(p, f); })
      return e.offloader_.state_host_data(p, f);
    else
      return nullptr;
  }

 private:
  static auto& slot(Engine& e, param_id p, state_field f, std::size_t offset, std::size_t n) {
    e.check_between_steps("parameter state access");
    e.spec_.check(p, "parameter state access");  // in range and of this engine's model
    auto& s = e.store_[p];
    ZSHARD_REQUIRE(range_within(offset, n, s.layout.shard_numel), error_kind::usage,
                   "state access of " + describe_range(offset, n) + " of parameter '" + s.spec->name +
                       "' whose shard has " + std::to_string(s.layout.shard_numel),
                   "offsets and counts are elements of this rank's shard: [0, layout(p).shard_numel)");
    // a frozen parameter's kept state too (what checkpoints save of it)
    ZSHARD_REQUIRE(f == state_field::working || s.spec->trainable || e.has_optimizer_state(p), error_kind::usage,
                   "parameter '" + s.spec->name + "' is frozen: it has no " + std::string(to_string(f)) + " state");
    if constexpr (!state_accessible<offloader_type>)
      ZSHARD_REQUIRE(f == state_field::working, error_kind::usage,
                     "this engine's Offloader does not provide state access (read_state/write_state)",
                     "implement them as offload/on_device.hpp does; see state/state_access.hpp");
    return s;
  }
};

}  // namespace zshard

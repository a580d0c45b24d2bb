#pragma once
// A tier that keeps working shards off the device: the one mechanism of parameter offload
// (docs/DESIGN.md, "offload tiers"). A parameter store built with offloaded shards allocates no
// device shard for its sharded parameters; the Offloader that keeps them elsewhere (host memory:
// offload/param_tier.hpp) attaches a shard_tier, and whatever reads or writes a working shard
// asks the store, which asks the tier:
//   host_shard(p)        p's working shard in host memory the CPU may read and write (null when
//                        p's shard is on the device, or the backend holds no storage)
//   stage(p, consumer)   a device copy of p's working shard for a collective about to be
//                        enqueued on the `consumer` role's stream: allocated and filled on the
//                        host_copy stream, which the consumer then waits for
//   unstage(consumer)    the collectives that read the staged copies have been issued: free the
//                        copies in the consumer's order
//   quiesce()            the host waits for every upload in flight, before it writes shards
// A tier is used from its rank's thread only.
#include <cstddef>

#include "zshard/backend/backend.hpp"
#include "zshard/model/model_spec.hpp"

namespace zshard {

template <class Backend>
class shard_tier {
 public:
  virtual void* host_shard(param_id p) noexcept = 0;
  virtual const void* stage(param_id p, stream_role consumer) = 0;
  virtual void unstage(stream_role consumer) noexcept = 0;
  virtual void quiesce() = 0;

 protected:
  shard_tier() = default;
  shard_tier(const shard_tier&) = default;
  shard_tier& operator=(const shard_tier&) = default;
  ~shard_tier() = default;
};

}  // namespace zshard

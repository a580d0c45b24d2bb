#pragma once
// A parameter's full value or optimizer state, across ranks, built on the engine's state access
// (state_access.hpp). Collective: every rank calls them with the same arguments, between steps.
//   gather_field(eng, p, f)          -> the full field as f32 on every rank (working, master, m, v)
//   scatter_field(eng, p, f, v, w)   rank w's full f32 value v becomes every rank's shard of f
//                                    (other ranks pass nullptr); for working, it is rounded to
//                                    p's dtype; write master and working together to change a
//                                    trainable parameter's value. w is a rank of the world: with
//                                    hybrid sharding the value is broadcast over the world
//                                    (eng.world_comm()), every shard group takes its shards.
//   gather_shards(eng, p, mine, t)   every rank's shard of p (shard_numel elements of dtype t
//                                    in host memory) -> the full value as f32 on every rank
// Memory: the full parameter once on every rank, for the call (as gather_param). Each
// collective carries p in its tag (collective_use::param_state), so ranks that name different
// parameters fail instead of mixing them. The engine's checked, documented entry points are
// engine/full_state.hpp's (gather_param, write_param, gather_grad, optimizer state).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard {

// The communicator every rank is in: the world's (hybrid sharding), else the engine's.
template <class Engine>
auto& world_of(Engine& eng) {
  if constexpr (requires { eng.world_comm(); })
    return eng.world_comm();
  else
    return eng.comm();
}

template <class Engine>
std::vector<float> gather_shards(Engine& eng, param_id p, const void* mine, dtype t) {
  const auto& l = eng.layout(p);
  const std::size_t w = size_of(t), world = static_cast<std::size_t>(eng.comm().size());
  std::vector<float> out(l.numel);
  if (l.replicated) {
    convert(mine, t, out.data(), dtype::f32, l.numel);
    return out;
  }
  std::vector<char> all(l.padded_numel * w);
  auto& b = eng.backend();
  using B = std::remove_reference_t<decltype(b)>;
  buffer<B> src(b, t, l.shard_numel, mem_category::scratch), dst(b, t, l.shard_numel * world, mem_category::scratch);
  auto s = b.make_stream();
  b.copy(src.data(), mine, l.shard_numel * w, s);
  b.synchronize(s);
  tagged::all_gather(eng.comm(), src.data(), dst.data(), l.shard_numel, t, comm_stream::of(s),
                     {collective_use::param_state, collective_tag::none, p});
  b.copy(all.data(), dst.data(), all.size(), s);
  b.synchronize(s);
  convert(all.data(), t, out.data(), dtype::f32, l.numel);
  return out;
}

template <class Engine>
std::vector<float> gather_field(Engine& eng, param_id p, state_field f) {
  const auto& l = eng.layout(p);
  const dtype t = f == state_field::working ? eng.store()[p].type : dtype::f32;
  std::vector<char> mine(l.shard_numel * size_of(t));
  eng.read_shard(p, f, 0, mine.data(), l.shard_numel);
  return gather_shards(eng, p, mine.data(), t);
}

template <class Engine>
void scatter_field(Engine& eng, param_id p, state_field f, const float* full, int writer) {
  const auto& l = eng.layout(p);
  auto& world = world_of(eng);
  ZSHARD_REQUIRE(writer >= 0 && writer < world.size(), error_kind::usage, "scatter_field: no rank " + std::to_string(writer));
  ZSHARD_REQUIRE(world.rank() != writer || full, error_kind::usage, "scatter_field: the writing rank passed no value");
  auto& b = eng.backend();
  using B = std::remove_reference_t<decltype(b)>;
  buffer<B> dev(b, dtype::f32, l.padded_numel, mem_category::scratch);
  std::vector<float> host(l.padded_numel, 0.0f);
  if (world.rank() == writer) std::copy(full, full + l.numel, host.begin());
  auto s = b.make_stream();
  b.copy(dev.data(), host.data(), host.size() * sizeof(float), s);
  b.synchronize(s);
  tagged::broadcast(world, dev.data(), l.padded_numel, dtype::f32, writer, comm_stream::of(s),
                    {collective_use::param_state, collective_tag::none, p});
  b.copy(host.data(), dev.data(), host.size() * sizeof(float), s);
  b.synchronize(s);
  const std::size_t first = l.owned_begin(eng.comm().rank()), n = l.owned_end(eng.comm().rank()) - first;
  if (f == state_field::working) {
    const dtype t = eng.store()[p].type;
    std::vector<char> conv(n * size_of(t));
    convert(host.data() + first, dtype::f32, conv.data(), t, n);
    eng.write_shard(p, f, 0, conv.data(), n);
  } else {
    eng.write_shard(p, f, 0, host.data() + first, n);
  }
}

}  // namespace zshard

#pragma once
// Partitioner: maps each parameter to shards. Contract:
//  - A family (core/policy_family.hpp) whose impl provides layout(numel, world, cfg), a pure function; every rank computes the same layout.
//  - A sharded parameter is padded to padded_numel = world * shard_numel >= numel; rank r holds
//    elements [r * shard_numel, (r + 1) * shard_numel) of the padded parameter (padding is
//    zero and never reaches the model). Collectives therefore always see equal per-rank counts.
//  - A replicated parameter has shard_numel == padded_numel == numel on every rank.
#include <concepts>
#include <cstddef>

#include "zshard/core/policy_family.hpp"
#include "zshard/core/policy_tags.hpp"
#include "zshard/partition/partition_config.hpp"
#include "zshard/partition/shard_layout.hpp"

namespace zshard {

template <class P>
concept partitioner = requires(const P& p, std::size_t numel, int world, const partition_config& cfg) {
  { p.layout(numel, world, cfg) } -> std::same_as<shard_layout>;
};

// A policy family that opted in (a structural match alone never counts) and whose
// implementation conforms.
template <class F, class B = any_backend, class C = any_comm>
concept partitioner_family = opts_into<F, partitioner_tag> && has_policy_impl<F, B, C> && partitioner<policy_impl_t<F, B, C>>;

// `static_assert(check_partitioner<my_partitioner>());` next to a Partitioner's definition; the
// engine checks its Partitioner family the same way, for its backend and communicator.
template <class Family, class Backend = any_backend, class Comm = any_comm>
constexpr bool check_partitioner() {
  constexpr bool tagged = opts_into<Family, partitioner_tag>;
  constexpr bool named = has_policy_impl<Family, Backend, Comm>;
  static_assert(tagged, "zshard: a Partitioner declares `using zshard_tag = zshard::partitioner_tag;`");
  static_assert(!tagged || named,
                "zshard: a Partitioner names its implementation: `template <class Backend, class Comm> using impl = "
                "...;` (one that needs neither names itself)");
  static_assert(!(tagged && named) || !inherits_base_impl<Family, Backend, Comm>(),
                "zshard: this Partitioner derives from a policy whose `impl` names the base, so it would run as the base; "
                "declare `template <class Backend, class Comm> using impl = <this type>;` in it");
  static_assert(!(tagged && named) || partitioner<policy_impl_t<Family, Backend, Comm>>,
                "zshard: a Partitioner provides `shard_layout layout(std::size_t numel, int world, "
                "const partition_config&) const`");
  return true;
}

}  // namespace zshard

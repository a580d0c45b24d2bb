#pragma once
// Partitioner: maps each parameter to shards. Contract:
//  - A family (core/policy_family.hpp) whose impl provides layout(param, world, cfg), a pure
//    function of the parameter's identity (id, name, shape, dtype: a policy may place
//    parameters by name or kind), the world size and the config; every rank computes the same
//    layout (the engine compares them across ranks at construction).
//  - A sharded parameter is padded to padded_numel = world * shard_numel >= numel; rank r holds
//    elements [r * shard_numel, (r + 1) * shard_numel) of the padded parameter (padding is
//    zero and never reaches the model). Collectives therefore always see equal per-rank counts.
//  - A replicated parameter has shard_numel == padded_numel == numel on every rank.
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>

#include "zshard/core/checked_size.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/shape.hpp"
#include "zshard/model/model_spec.hpp"

#include "zshard/core/policy_family.hpp"
#include "zshard/core/policy_tags.hpp"
#include "zshard/partition/partition_config.hpp"
#include "zshard/partition/shard_layout.hpp"

namespace zshard {

// What a Partitioner knows of the parameter it places.
struct param_identity {
  param_id id = ~param_id{0};
  std::string_view name;
  zshard::shape shape;
  dtype type = dtype::f32;  // working dtype
  bool trainable = true;
  std::size_t numel() const noexcept { return static_cast<std::size_t>(shape.numel()); }

  static param_identity of(const model_spec& spec, param_id p, dtype default_type) {
    const param_spec& s = spec.param(p);
    return {spec.check(p), s.name, s.shape, s.type.value_or(default_type), s.trainable};
  }
};

template <class P>
concept partitioner = requires(const P& p, const param_identity& param, int world, const partition_config& cfg) {
  { p.layout(param, world, cfg) } -> std::same_as<shard_layout>;
};

// The engine (and the planner) check every layout a Partitioner returns: a wrong one would
// read past a buffer or leave elements out of the collectives, silently.
inline void validate_layout(const shard_layout& l, const param_identity& p, int world) {
  const auto what = [&] {  // built only on failure: construction checks every parameter
    return "the Partitioner's layout of parameter '" + std::string(p.name) + "' (" + std::to_string(p.numel()) +
           " elements) ";
  };
  const char* fix = "fix the Partitioner: a sharded layout has shard_numel * world == padded_numel >= numel; a "
                    "replicated one has shard_numel == padded_numel == numel";
  ZSHARD_REQUIRE(l.numel == p.numel(), error_kind::config, what() + "says numel = " + std::to_string(l.numel), fix);
  if (l.replicated) {
    ZSHARD_REQUIRE(l.shard_numel == l.numel && l.padded_numel == l.numel, error_kind::config,
                   what() + "is replicated with shard_numel = " + std::to_string(l.shard_numel) +
                       ", padded_numel = " + std::to_string(l.padded_numel),
                   fix);
    return;
  }
  ZSHARD_REQUIRE(l.padded_numel >= l.numel, error_kind::config,
                 what() + "has padded_numel = " + std::to_string(l.padded_numel) + ", below its size", fix);
  ZSHARD_REQUIRE(l.shard_numel > 0 && checked_mul(l.shard_numel, static_cast<std::size_t>(world), "layout") ==
                                          l.padded_numel,
                 error_kind::config,
                 what() + "has shards that do not add up: " + std::to_string(world) + " x " +
                     std::to_string(l.shard_numel) + " != padded_numel = " + std::to_string(l.padded_numel),
                 fix);
}

// A policy family that opted in (a structural match alone never counts) and whose
// implementation conforms.
template <class F, class B = any_backend, class C = any_comm>
concept partitioner_family = opts_into<F, partitioner_tag> && has_policy_impl<F, B, C> && partitioner<policy_impl_t<F, B, C>>;

// `static_assert(check_partitioner<my_partitioner>());` next to a Partitioner's definition; the
// engine checks its Partitioner family the same way, for its backend and communicator.
template <class Family, class Backend = any_backend, class Comm = any_comm>
constexpr bool check_partitioner() {
  ZSHARD_CHECK_POLICY_FAMILY(Family, Backend, Comm, partitioner_tag, "a Partitioner", "Partitioner");
  constexpr bool named = policy_named<Family, partitioner_tag, Backend, Comm>;
  static_assert(!named || partitioner<policy_impl_t<Family, Backend, Comm>>,
                "zshard: a Partitioner provides `shard_layout layout(const param_identity&, int world, "
                "const partition_config&) const`");
  return true;
}

}  // namespace zshard

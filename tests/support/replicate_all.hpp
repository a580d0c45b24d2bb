#pragma once
// A Partitioner that keeps every parameter whole on every rank (plain data parallelism): the
// engine then all-reduces every gradient and never gathers. The right Partitioner the policy
// tests swap in, and the one the compile-fail cases (tests/layout/bad_policies.cpp) start from.
#include "zshard/partition/partitioner.hpp"

namespace test_support {

struct replicate_all {
  using zshard_tag = zshard::partitioner_tag;
  template <class Backend, class Comm>
  using impl = replicate_all;
  zshard::shard_layout layout(const zshard::param_identity& p, int, const zshard::partition_config&) const {
    return {.numel = p.numel(), .shard_numel = p.numel(), .padded_numel = p.numel(), .replicated = true};
  }
};
static_assert(zshard::check_partitioner<replicate_all>());

}  // namespace test_support

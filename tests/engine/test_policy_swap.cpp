// Policies are chosen by type at compile time: engines with different policies live side by
// side in one program, and each trains correctly.
#include <doctest/doctest.h>

#include "../support/replicate_all.hpp"
#include "toy_training.hpp"

using namespace zshard;

namespace {

// Every parameter whole on every rank (plain data parallelism): all-reduce, never a gather.
using test_support::replicate_all;

struct data_parallel_policies : default_policies {
  using partitioner = replicate_all;
};

// A type that forgot its opt-in tag is not a Partitioner, however well it matches.
struct untagged {
  shard_layout layout(const param_identity&, int, const partition_config&) const { return {}; }
};
static_assert(partitioner<untagged> && !partitioner_family<untagged>);
static_assert(partitioner_family<partition::even> && partitioner_family<replicate_all>);

}  // namespace

TEST_CASE("two engines with different partitioners in one program, both equal to the reference") {
  for (int world : {2, 3}) {
    toy::train_options o;
    o.world = world;
    o.steps = 3;
    o.micro_batches = 2;
    o.engine.adamw.lr = 1e-2f;
    const auto want = toy::train_reference(o);
    const auto sharded = toy::train_sharded<default_policies>(o);
    const auto replicated = toy::train_sharded<data_parallel_policies>(o);
    for (std::size_t p = 0; p < want.params.size(); ++p)
      for (std::size_t i = 0; i < want.params[p].size(); ++i) {
        REQUIRE(sharded.params[p][i] == doctest::Approx(want.params[p][i]).epsilon(1e-5));
        REQUIRE(replicated.params[p][i] == doctest::Approx(want.params[p][i]).epsilon(1e-5));
      }
    CHECK(sharded.peak_gathered_bytes > 0);
    CHECK(replicated.peak_gathered_bytes == 0);  // nothing is ever gathered when all is replicated
  }
}

// Parameter offload (offload_config::params = host, offload/param_tier.hpp): the working shards
// of sharded parameters live in the host Offloader's memory and each gather uploads them. On
// the host backend a second host tier stands in for the device (the host ledger holds the
// shards, the backend's ledger the upload buffers). Training is bitwise equal to training
// without offload with the same Offloader (host_adam: same kernels, same order), at worlds 1-4,
// with activation checkpointing, a no-grad pass each step and a tied weight; also through the
// device (staging) path, where replicated parameters stay on the device; the ledgers hold what
// the tiers say; the upload buffers are gone once a gather group is issued; an Offloader that
// cannot keep shards is refused by name; freezing, rewriting and unfreezing an offloaded
// parameter trains as without offload (unfreezing once read the shard from device memory).
#include <doctest/doctest.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "../engine/equivalence_check.hpp"
#include "../engine/feature_training.hpp"
#include "../engine/hybrid_training.hpp"
#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "offload_fixtures.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/offload/host_adam.hpp"

using namespace zshard;

namespace {

using param_tier_policies = test_support::host_offload_policies;
// Gradients and the working values of device-resident parameters go through host_adam's staging.
using param_tier_backend = offload_test::device_like_backend;

struct param_tier_result {
  toy::train_result train;
  std::size_t device_sharded = 0, device_scratch_now = 0, device_scratch_peak = 0;
  std::size_t host_sharded = 0;
  std::size_t expected_host_sharded = 0, expected_device_sharded = 0, largest_group_shards = 0;
  std::uint64_t uploaded = 0;
};

using offload_test::offload_options;

// Checkpointed training with a no-grad pass per step (hybrid_training.hpp); rank 0's ledgers.
template <class Backend>
param_tier_result train(const toy::train_options& o) {
  param_tier_result r;
  offload_test::train_offloaded<param_tier_policies, Backend>(o, r.train, [&](auto& eng, Backend& backend) {
    const memory_ledger& host = eng.offloader().state_ledger();
    r.device_sharded = backend.ledger().current(mem_category::sharded_params);
    r.device_scratch_now = backend.ledger().current(mem_category::scratch);
    r.device_scratch_peak = backend.ledger().peak(mem_category::scratch);
    r.host_sharded = host.current(mem_category::sharded_params);
    for (param_id p = 0; p < eng.spec().params().size(); ++p) {
      const auto& l = eng.layout(p);
      const std::size_t bytes = l.shard_numel * size_of(eng.store()[p].type);
      (l.replicated ? r.expected_device_sharded : r.expected_host_sharded) += bytes;
    }
    if constexpr (requires { eng.offloader().uploaded_bytes(); }) r.uploaded = eng.offloader().uploaded_bytes();
  });
  return r;
}

void check_bitwise(const toy::train_result& got, const toy::train_result& want, const std::string& what) {
  offload_test::check_same_params(got, want, what);
  INFO(what);
  for (std::size_t s = 0; s < got.reports.size(); ++s) CHECK(got.reports[s].grad_norm == want.reports[s].grad_norm);
}

}  // namespace

TEST_CASE(
    "parameter offload trains bit for bit like no offload: worlds 1-4, checkpointing, no-grad pass, tied weight") {
  for (int world = 1; world <= 4; ++world) {
    for (dtype t : {dtype::f32, dtype::bf16}) {
      const std::string what = "world " + std::to_string(world) + ", " + std::string(to_string(t));
      auto o = offload_options(world, t);
      const auto want = train<host_backend>(o);
      o.engine.offload.params = offload_tier::host;
      const auto got = train<host_backend>(o);
      check_bitwise(got.train, want.train, what);
      // and it trained: the parameters moved from their initial values
      CHECK(got.train.reports.back().grad_norm > 0.0);
      // the tiers: sharded parameters' shards in the host ledger, replicated ones on the device
      INFO(what);
      CHECK(got.host_sharded == got.expected_host_sharded);
      CHECK(got.host_sharded > 0);
      CHECK(got.device_sharded == got.expected_device_sharded);
      CHECK(want.device_sharded == got.expected_host_sharded + got.expected_device_sharded);
      CHECK(want.host_sharded == 0);
      // upload buffers are scratch while a gather group is issued, and gone after it
      CHECK(got.device_scratch_now == 0);
      CHECK(got.uploaded > 0);
    }
  }
}

TEST_CASE(
    "parameter offload through the device (staging) path: offloaded shards written on the host, replicated ones "
    "staged") {
  for (int world : {1, 3}) {
    for (dtype t : {dtype::f32, dtype::bf16}) {
      const std::string what = "world " + std::to_string(world) + ", " + std::string(to_string(t));
      auto o = offload_options(world, t);
      o.engine.offload.host_tile_numel = 32;
      o.engine.offload.host_staging_numel = 64;  // several rounds for the replicated parameters
      const auto want = train<param_tier_backend>(o);
      o.engine.offload.params = offload_tier::host;
      const auto got = train<param_tier_backend>(o);
      check_bitwise(got.train, want.train, what);
      INFO(what);
      CHECK(got.host_sharded == got.expected_host_sharded);
      CHECK(got.device_sharded == got.expected_device_sharded);
    }
  }
}

TEST_CASE("parameter offload: every gather uploads its shard once, and the uploads of a group are its only scratch") {
  // On-demand gathers, everything sharded, one micro-batch: each scope's parameters are gathered
  // once per scope (the tied E twice per forward pass, again in backward), so the bytes uploaded
  // equal the all-gathers' inputs, counted from the schedule; the device's scratch peak is the
  // largest group's shards or the reduce-scatter output, whichever is larger.
  struct on_demand_host : default_policies {
    using offloader = offload::host_adam;
    using prefetcher = prefetch::on_demand;
  };
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    toy::train_options o = toy::base_options(world);
    o.engine.partition.persistence_threshold_numel = 0;
    o.engine.offload.params = offload_tier::host;
    o.engine.offload.host_threads = 1;
    std::uint64_t uploaded = 0, expected = 0;
    std::size_t scratch_peak = 0, largest = 0;
    std::mutex mu;
    run_ranks(world, [&](thread_comm& comm) {
      host_backend backend;
      toy::ids id;
      engine<host_backend, thread_comm, on_demand_host> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
      const toy::batch b = toy::make_batch(o.model.vocab, 0, o.rows);
      toy::run_micro_batch(eng, o.model, id, b, false);
      eng.step();
      if (comm.rank() != 0) return;
      std::lock_guard lock(mu);
      uploaded = eng.offloader().uploaded_bytes();
      scratch_peak = backend.ledger().peak(mem_category::scratch);
      // every scope of the micro-batch gathers its module's parameters (nothing stays gathered
      // between scopes on demand): forward and backward, each use
      for (int pass = 0; pass < 2; ++pass)
        for (module_id m : {id.embed, id.head}) {
          std::size_t group = 0;
          for (param_id p : eng.spec().module(m).params) group += eng.layout(p).shard_numel * sizeof(float);
          expected += group;
          largest = std::max(largest, group);
        }
      for (int pass = 0; pass < 2; ++pass)
        for (int l : toy::layer_sequence(o.model)) {
          std::size_t group = 0;
          for (param_id p : eng.spec().module(id.layer[l]).params) group += eng.layout(p).shard_numel * sizeof(float);
          expected += group;
          largest = std::max(largest, group);
        }
    });
    CHECK(uploaded == expected);
    CHECK(scratch_peak >= largest);
  }
}

TEST_CASE("parameter offload is refused by name with an Offloader that keeps state on the device") {
  toy::ids id;
  host_backend backend;
  null_comm comm(0, 1);
  engine_config cfg;
  cfg.offload.params = offload_tier::host;
  const error e =
      test_support::thrown_by([&] { engine<host_backend, null_comm> eng(backend, comm, toy::make_spec({}, id), cfg); });
  CHECK(e.kind() == error_kind::config);
  CHECK(std::string(e.what()).find("offload_config.params = host") != std::string::npos);
  CHECK(std::string(e.what()).find("host_adam") != std::string::npos);
  CHECK(backend.ledger().total_current() == 0);  // nothing left allocated
}

namespace {

// Training in which the first sharded parameter is frozen for step 1 (its working value also
// rewritten then, so that unfreezing reads it back to refresh the master) and unfrozen for
// step 2: unfreezing reads the working shard wherever it lives, host memory when offloaded.
template <class Backend>
toy::train_result train_with_pause(const toy::train_options& o) {
  toy::train_result result;
  std::mutex mu;
  zshard::run_ranks(o.world, [&](zshard::thread_comm& comm) {
    Backend backend;
    toy::ids id;
    zshard::engine<Backend, zshard::thread_comm, param_tier_policies> eng(backend, comm, toy::make_spec(o.model, id),
                                                                          o.engine);
    param_id paused = 0;
    while (eng.layout(paused).replicated) ++paused;
    int calls = 0;
    toy::train_rank(
        eng, comm.rank(), o,
        [&](const toy::batch& b, bool) {
          if (calls == o.micro_batches) {  // before step 1
            eng.set_trainable(paused, false);
            std::vector<float> halved = eng.gather_param(paused);
            for (float& x : halved) x *= 0.5f;
            eng.write_param(paused, halved, /*writer=*/0);
          }
          if (calls == 2 * o.micro_batches) eng.set_trainable(paused, true);  // before step 2
          ++calls;
          feat::run_micro_batch(eng, o.model, id, b);  // no gradient for the frozen parameter
        },
        mu, result);
  });
  return result;
}

}  // namespace

TEST_CASE("parameter offload: freezing, rewriting and unfreezing a parameter whose shard lives in host memory "
          "trains bit for bit like no offload") {
  for (int world : {1, 3}) {
    auto o = offload_options(world, dtype::bf16);
    o.steps = 4;
    const auto want = train_with_pause<param_tier_backend>(o);
    o.engine.offload.params = offload_tier::host;
    check_bitwise(train_with_pause<param_tier_backend>(o), want, "device-like backend, world " + std::to_string(world));
    const auto want_host = train_with_pause<host_backend>(offload_options(world, dtype::bf16));
    auto oh = offload_options(world, dtype::bf16);
    oh.engine.offload.params = offload_tier::host;
    check_bitwise(train_with_pause<host_backend>(oh), want_host, "host backend, world " + std::to_string(world));
  }
}

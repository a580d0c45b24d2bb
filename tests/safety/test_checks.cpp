// Issue 11, points 4, 5 and 8: ids out of range are usage errors everywhere; every size
// computation is overflow-checked (the phantom backend never charges 0 bytes for a huge
// shape); a custom Partitioner sees each parameter's identity and its layouts are validated.
#include <doctest/doctest.h>

#include <limits>

#include "../support/policies.hpp"
#include "stack_model.hpp"
#include "../support/error_capture.hpp"
#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/partition/even_partitioner.hpp"

using namespace safety;
using test_support::kind_of;
using test_support::message_of;

TEST_CASE("ids out of range are usage errors: gather_param, layout, scopes, model_spec accessors") {
  run_ranks(2, [](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm> eng(backend, comm, stack_spec(2, 0), stack_config());
    CHECK(message_of([&] { eng.gather_param(4); }).find("gather_param: parameter id 4 does not exist") !=
          std::string::npos);
    CHECK(kind_of([&] { eng.layout(99); }) == error_kind::usage);
    CHECK(kind_of([&] { eng.forward(2); }) == error_kind::usage);
    CHECK(kind_of([&] { eng.spec().param(7); }) == error_kind::usage);
    CHECK(kind_of([&] { eng.spec().module(7); }) == error_kind::usage);
    CHECK(eng.open_scopes() == 0);
    eng.forward(1).close();  // still usable
  });
}

TEST_CASE("size computations are overflow-checked") {
  const auto big = std::int64_t{1} << 32;
  CHECK(message_of([&] { shape s{big, big}; }).find("more elements than a 64-bit count holds") != std::string::npos);

  partition_config pc;
  pc.shard_alignment_numel = std::numeric_limits<std::size_t>::max() / 2;
  CHECK(kind_of([&] { partition::even{}.layout({.shape = {10}}, 4, pc); }) == error_kind::config);

  memory_ledger l("test");
  l.charge(mem_category::scratch, 10);
  CHECK(kind_of([&] { l.charge(mem_category::scratch, std::numeric_limits<std::size_t>::max()); }) ==
        error_kind::budget);
  CHECK(l.total_current() == 10);

  host_backend hb;
  CHECK(kind_of([&] { buffer<host_backend>(hb, dtype::f32, std::numeric_limits<std::size_t>::max() / 2,
                                           mem_category::scratch); }) == error_kind::config);
  CHECK(hb.ledger().total_current() == 0);
}

TEST_CASE("the phantom backend never charges 0 bytes for a huge shape: a clear error instead") {
  model_spec spec;
  const param_id p = spec.add_param("huge", {std::int64_t{1} << 62});  // 2^62 f32 = 2^64 bytes: wraps to 0
  spec.add_module("m", {p});
  engine_config cfg;
  cfg.prefetch.allow_oversized_module = true;
  phantom_backend backend;
  null_comm comm(0, 1);
  const std::string msg = message_of([&] { engine<phantom_backend, null_comm> eng(backend, comm, spec, cfg); });
  CHECK(msg.find("overflows size_t") != std::string::npos);
}

namespace {

// Places parameters by name: biases (".b") whole on every rank, the rest sharded evenly.
struct by_name {
  using zshard_tag = partitioner_tag;
  template <class Backend, class Comm>
  using impl = by_name;
  shard_layout layout(const param_identity& p, int world, const partition_config& cfg) const {
    if (p.name.ends_with(".b")) return {.numel = p.numel(), .shard_numel = p.numel(), .padded_numel = p.numel(), .replicated = true};
    CHECK(p.type == dtype::bf16);
    CHECK(p.shape.rank() == 2);
    return partition::even{}.layout(p, world, cfg);
  }
};
static_assert(check_partitioner<by_name>());

// Returns a wrong layout for parameter `bad` (by id): padded below the size, or shards that do
// not add up to the padded size.
template <int mode>
struct broken {
  using zshard_tag = partitioner_tag;
  template <class Backend, class Comm>
  using impl = broken;
  shard_layout layout(const param_identity& p, int world, const partition_config& cfg) const {
    shard_layout l = partition::even{}.layout(p, world, cfg);
    if (p.id != 2) return l;
    if (mode == 0) {
      l.shard_numel = p.numel() / std::size_t(world) - 1;
      l.padded_numel = l.shard_numel * std::size_t(world);
    } else {
      l.padded_numel += 1;
    }
    return l;
  }
};

template <class Partitioner>
using with = test_support::with_partitioner<Partitioner>;

}  // namespace

TEST_CASE("a Partitioner receives each parameter's identity; its layouts are validated at construction") {
  run_ranks(3, [](thread_comm& comm) {
    host_backend backend;
    const model_spec spec = stack_spec(2, 1);
    engine<host_backend, thread_comm, with<by_name>> eng(backend, comm, spec, stack_config());
    CHECK(eng.layout(1).replicated);
    CHECK_FALSE(eng.layout(0).replicated);
    const std::string below =
        message_of([&] { engine<host_backend, thread_comm, with<broken<0>>> e(backend, comm, spec, stack_config()); });
    CHECK(below.find("layout of parameter 'b1.w' (63 elements) has padded_numel = ") != std::string::npos);
    CHECK(below.find("below its size") != std::string::npos);
    const std::string sum =
        message_of([&] { engine<host_backend, thread_comm, with<broken<1>>> e(backend, comm, spec, stack_config()); });
    CHECK(sum.find("shards that do not add up") != std::string::npos);
  });
}

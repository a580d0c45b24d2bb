// The host Offloader (offload::host_adam) through the engine: training the toy model with it
// gives the same parameters as the default (on-device) Offloader on the host backend, on
// every kernel path this CPU runs, with several thread counts and tile sizes, through the
// device (staging) path, with clipping, micro-batches, bf16/f16 and a skipped overflow step;
// its host ledger holds the optimizer state and gradient shards the device ledger no longer
// holds; with a backend that holds no storage it only accounts.
//
// Tolerance: bitwise. Both Offloaders run the same IEEE operations in the same order
// (test_adamw_kernels.cpp shows the kernels equal the reference bit for bit), and gradients
// accumulate in the same order. The one place the two may round apart is the global norm's
// double sum (per tile here, per parameter there), which reaches the update only through the
// clipping coefficient: with clipping on, parameters are compared within a tolerance instead
// (also when built with FMA enabled, where the compiler may contract the scalar reference);
// see check_same.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

#include "../support/error_capture.hpp"
#include "../support/policies.hpp"
#include "../engine/toy_training.hpp"
#include "offload_fixtures.hpp"
#include "zshard/offload/host_adam.hpp"

using namespace zshard;

namespace {

using offload_test::device_like_backend;
static_assert(check_backend<device_like_backend>());
static_assert(offload::memory_is_host<host_backend>() && !offload::memory_is_host<device_like_backend>());

// host_adam with fixed offload settings whatever engine_config::offload says: a family can
// override the values it is given.
template <int Threads, optim::simd_path Path, std::size_t Tile, std::size_t Staging = 4 * Tile>
struct host_adam_with {
  using zshard_tag = offloader_tag;
  template <class B, class C>
  struct impl : offload::host_adam_impl<B, C> {
    impl(param_store<B>& store, C& comm, const optim::adamw_config& hyper, const offload_config&)
        : offload::host_adam_impl<B, C>(store, comm, hyper,
                                        offload_config{.host_threads = Threads, .host_path = Path,
                                                       .host_tile_numel = Tile, .host_staging_numel = Staging}) {}
  };
};

template <class Offloader>
using policies_with = test_support::with_offloader<Offloader>;
using host_policies = test_support::host_offload_policies;
static_assert(check_offloader<offload::host_adam, host_backend, thread_comm>());
static_assert(check_offloader<offload::host_adam, device_like_backend, thread_comm>());

// A host budget of 1000 bytes: too small for the toy model's optimizer state.
struct tight_host_adam {
  using zshard_tag = offloader_tag;
  template <class B, class C>
  struct impl : offload::host_adam_impl<B, C> {
    impl(param_store<B>& store, C& comm, const optim::adamw_config& hyper, const offload_config&)
        : offload::host_adam_impl<B, C>(store, comm, hyper, offload_config{.host_threads = 1, .host_budget_bytes = 1000}) {}
  };
};

struct run_result {
  toy::train_result train;
  std::size_t device_optimizer_bytes = 0, device_grad_shard_bytes = 0;  // rank 0, backend ledger
  std::size_t host_optimizer_bytes = 0, host_grad_shard_bytes = 0, host_scratch_bytes = 0;  // state ledger
  std::string state_ledger_name;
  std::size_t expected_state_numel = 0;  // sum over trainable parameters of the shard, rounded to 32
};

// toy::train_sharded, generic over the backend, also reading rank 0's ledgers.
template <class Backend, class Policies>
run_result train(const toy::train_options& o) {
  run_result result;
  result.train = toy::train_sharded<Policies, Backend>(o, [&](auto& eng, Backend& backend, int rank) {
    if (rank != 0) return;
    result.device_optimizer_bytes = backend.ledger().current(mem_category::optimizer_state);
    result.device_grad_shard_bytes = backend.ledger().current(mem_category::grad_shards);
    const memory_ledger& host = eng.offloader().state_ledger();
    result.state_ledger_name = host.name();
    result.host_optimizer_bytes = host.current(mem_category::optimizer_state);
    result.host_grad_shard_bytes = host.current(mem_category::grad_shards);
    result.host_scratch_bytes = host.current(mem_category::scratch);
    for (param_id p = 0; p < eng.spec().params().size(); ++p)
      if (eng.spec().params()[p].trainable) result.expected_state_numel += optim::round_up_to_granule(eng.layout(p).shard_numel);
  });
  return result;
}

toy::train_options base(int world) {
  toy::train_options o;
  o.world = world;
  o.steps = 4;
  o.model.dim = 24;  // W: 576 elements, E: 312: several 32-element tiles per shard
  o.engine.adamw.lr = 1e-2f;
  o.engine.adamw.weight_decay = 0.1f;
  o.engine.partition.persistence_threshold_numel = 8;  // the frozen scale replicated
  o.engine.reduce.reduce_bucket_numel = 300;           // several flushes per backward
  return o;
}

// exact: bitwise. Otherwise (clipping on, or an FMA build) each parameter agrees normwise to
// 1e-6 (f32) or one ulp of its working dtype (bf16 2^-7, f16 2^-10): a master next to a
// rounding boundary may round the other way, and the next forward pass sees that.
void check_same(const toy::train_result& got, const toy::train_result& want, bool exact, dtype working,
                const std::string& what) {
  INFO(what);
#if defined(__FMA__)
  exact = false;  // the compiler may contract the scalar reference (on-device path), see test_adamw_kernels.cpp
#endif
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t p = 0; p < got.params.size(); ++p) {
    INFO("parameter #" << p);
    const auto& g = got.params[p];
    const auto& w = want.params[p];
    REQUIRE(g.size() == w.size());
    if (exact) {
      CHECK(std::memcmp(g.data(), w.data(), g.size() * sizeof(float)) == 0);
    } else {
      const double tol = working == dtype::f32 ? 1e-6 : working == dtype::bf16 ? 0x1p-7 : 0x1p-10;
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        diff += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
        norm += double(w[i]) * w[i];
      }
      CHECK(std::sqrt(diff) <= tol * std::sqrt(norm));
    }
  }
  REQUIRE(got.reports.size() == want.reports.size());
  for (std::size_t s = 0; s < got.reports.size(); ++s) {
    CHECK(got.reports[s].skipped == want.reports[s].skipped);
    CHECK(got.reports[s].step == want.reports[s].step);
    CHECK(got.reports[s].loss_scale == want.reports[s].loss_scale);
    if (!want.reports[s].skipped)
      CHECK(got.reports[s].grad_norm == doctest::Approx(want.reports[s].grad_norm).epsilon(exact ? 1e-12 : 1e-5));
  }
}

}  // namespace

TEST_CASE("host_adam trains exactly like the default Offloader: worlds 1-3, micro-batches, clipping, bf16, f16") {
  for (int world : {1, 2, 3}) {
    for (int variant = 0; variant < 4; ++variant) {
      auto o = base(world);
      std::string what = "world " + std::to_string(world);
      bool clipped = false;
      if (variant == 1) {
        o.micro_batches = 3;
        what += ", 3 micro-batches";
      } else if (variant == 2) {
        o.micro_batches = 2;
        o.engine.clip_norm = 0.05;
        clipped = true;
        what += ", clipping";
      } else if (variant == 3) {
        o.engine.param_dtype = dtype::bf16;
        o.micro_batches = 2;
        what += ", bf16";
      }
      const auto want = toy::train_sharded(o);
      const auto got = train<host_backend, host_policies>(o);
      check_same(got.train, want, !clipped, o.engine.param_dtype, what);
      if (clipped)
        for (const auto& r : got.train.reports) CHECK(r.clip_coefficient < 1.0);
    }
    auto o = base(world);  // f16 with dynamic loss scaling and a forced overflow
    o.engine.param_dtype = dtype::f16;
    o.engine.loss_scale = {.enabled = true, .initial_scale = 1024.f, .growth_factor = 2.f, .backoff_factor = 0.5f,
                           .growth_interval = 2, .min_scale = 1.f};
    o.steps = 5;
    o.overflow_step = 1;
    const auto got = train<host_backend, host_policies>(o);
    check_same(got.train, toy::train_sharded(o), true, dtype::f16, "f16 with an overflow, world " + std::to_string(world));
    CHECK(got.train.reports[1].skipped);
  }
}

TEST_CASE("host_adam: every runnable kernel path, thread count and tile size gives the same training") {
  using optim::simd_path;
  auto o = base(2);
  o.micro_batches = 2;
  o.engine.param_dtype = dtype::bf16;
  const auto want = toy::train_sharded(o);
  auto run = [&]<class Family>(Family, const char* what) {
    check_same(train<host_backend, policies_with<Family>>(o).train, want, true, dtype::bf16, what);
  };
  run(host_adam_with<1, simd_path::scalar, 32>{}, "scalar, 1 thread, tiles of 32");
  if (optim::path_supported(simd_path::avx2)) {
    run(host_adam_with<2, simd_path::avx2, 32>{}, "avx2, 2 threads, tiles of 32");
    run(host_adam_with<3, simd_path::avx2, 4096>{}, "avx2, 3 threads, tiles of 4096");
  }
  if (optim::path_supported(simd_path::avx512)) run(host_adam_with<2, simd_path::avx512, 64>{}, "avx512, 2 threads, tiles of 64");
  if (optim::path_supported(simd_path::avx512_bf16))
    run(host_adam_with<3, simd_path::avx512_bf16, 32>{}, "avx512_bf16, 3 threads, tiles of 32");
}

TEST_CASE("host_adam through staging (device memory): same training, staging charged as host scratch") {
  for (int world : {1, 3}) {
    for (dtype w : {dtype::f32, dtype::bf16}) {
      auto o = base(world);
      o.micro_batches = 2;
      o.engine.param_dtype = w;
      const std::string what = "world " + std::to_string(world) + ", " + std::string(to_string(w));
      // staging halves of 64 elements: every shard streams in several chunks and rounds
      const auto small = train<device_like_backend, policies_with<host_adam_with<2, optim::simd_path::automatic, 32, 64>>>(o);
      check_same(small.train, toy::train_sharded(o), true, w, what + ", staging of 64");
      CHECK(small.host_scratch_bytes == 2 * 64 * sizeof(float));
      const auto one = train<device_like_backend, policies_with<host_adam_with<1, optim::simd_path::automatic, 32, 4096>>>(o);
      check_same(one.train, toy::train_sharded(o), true, w, what + ", 1 thread, one round");
    }
  }
}

TEST_CASE("host_adam: optimizer state and gradient shards move from the device ledger to the host ledger") {
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const auto o = base(world);
    const auto host = train<host_backend, host_policies>(o);
    const auto device = train<host_backend, default_policies>(o);
    CHECK(host.device_optimizer_bytes == 0);
    CHECK(host.device_grad_shard_bytes == 0);
    CHECK(host.state_ledger_name == "host (offloaded optimizer state)");
    CHECK(host.host_optimizer_bytes == 3 * 4 * host.expected_state_numel);  // master, m, v in fp32
    CHECK(host.host_grad_shard_bytes == 4 * host.expected_state_numel);
    CHECK(host.host_scratch_bytes == 0);  // host memory: no staging
    CHECK(device.device_optimizer_bytes > 0);
    CHECK(device.device_optimizer_bytes <= host.host_optimizer_bytes);  // host arrays pad each shard to 32 elements
  }
}

TEST_CASE("host_adam: a host budget that cannot hold the state fails at construction, naming the host ledger") {
  const error e = test_support::thrown_by([] { train<host_backend, policies_with<tight_host_adam>>(base(1)); });
  CHECK(e.kind() == error_kind::budget);
  CHECK(std::string(e.what()).find("host (offloaded optimizer state)") != std::string::npos);
  offload_config bad;
  bad.host_threads = -1;
  CHECK_THROWS_AS(bad.validate(), error);
  bad = {};
  bad.host_staging_numel = 16;
  bad.host_tile_numel = 64;
  CHECK_THROWS_AS(bad.validate(), error);
}

namespace {

// A backend that holds no storage (like the phantom backend): allocations are placeholders
// that must never be dereferenced, and every data operation is counted.
struct accounting_backend {
  using zshard_tag = backend_tag;
  static constexpr bool holds_storage = false;
  struct stream {};
  struct event {};
  memory_ledger device{"device (accounting only)"};
  int data_calls = 0;

  memory_ledger& ledger() { return device; }
  void* allocate(std::size_t bytes, mem_category c) {
    if (bytes == 0) return nullptr;
    device.charge(c, bytes);
    return reinterpret_cast<void*>(std::uintptr_t{0x1000});  // faults if anyone reads it
  }
  void deallocate(void*, std::size_t bytes, mem_category c) { device.release(c, bytes); }
  stream make_stream() { return {}; }
  event make_event() { return {}; }
  void record(event&, stream&) {}
  void wait(stream&, const event&) {}
  void synchronize(stream&) {}
  void copy(void*, const void*, std::size_t, stream&) { ++data_calls; }
  void fill_zero(void*, std::size_t, stream&) { ++data_calls; }
  void convert(const void*, dtype, void*, dtype, std::size_t, stream&) { ++data_calls; }
  void add_into(float*, const float*, std::size_t, stream&) { ++data_calls; }
  grad_stats grad_stats_of(const float*, std::size_t, stream&) const { return {}; }
  void adamw(const optim::adamw_step&, float*, float*, float*, const float*, std::size_t, void*, dtype, stream&) {
    ++data_calls;
  }
};
static_assert(check_backend<accounting_backend>());

struct rank3_of_8 {
  int rank() const { return 3; }
  int size() const { return 8; }
};

}  // namespace

TEST_CASE("host_adam on a backend without storage accounts the host state of a 7B model and touches nothing") {
  model_spec spec;
  const std::int64_t rows = 70'000, cols = 100'000;  // 7e9 parameters
  const param_id w = spec.add_param("w", {rows, cols});
  const param_id b = spec.add_param("b", {cols}, {.decay = false});
  const param_id frozen = spec.add_param("frozen", {cols}, {.trainable = false});
  std::vector<shard_layout> layouts;
  for (const auto& p : spec.params()) {
    const std::size_t shard = shard_count(p.numel(), 8);
    layouts.push_back({.numel = p.numel(), .shard_numel = shard, .padded_numel = 8 * shard});
  }
  accounting_backend backend;
  param_store<accounting_backend> store(backend, spec, layouts, dtype::bf16);
  engine_config cfg;
  rank3_of_8 comm;
  offload::host_adam_impl<accounting_backend, rank3_of_8> off(store, comm, cfg.adamw, offload_config{.host_threads = 4});
  CHECK(off.threads() == 1);  // no work ever runs, so no threads are started

  const auto* placeholder = reinterpret_cast<const float*>(std::uintptr_t{0x2000});
  for (param_id p : {w, b}) off.init_param(p, placeholder);
  auto reduce_stream = backend.make_stream();
  for (int micro = 0; micro < 2; ++micro)
    for (param_id p : {w, b}) off.accumulate_grad(p, placeholder, layouts[p].shard_numel, reduce_stream);
  const grad_stats st = off.local_grad_stats();
  CHECK(st.sum_squares == 0.0);
  CHECK(!st.nonfinite);
  off.update({.step = 1, .lr = 1e-4f, .grad_scale = 0.5f});
  off.discard_grads();
  CHECK(backend.data_calls == 0);
  CHECK(off.master(w).empty());

  const std::size_t numel = optim::round_up_to_granule(layouts[w].shard_numel) + optim::round_up_to_granule(layouts[b].shard_numel);
  const memory_ledger& host = off.state_ledger();
  CHECK(host.current(mem_category::optimizer_state) == 12 * numel);  // ~10.5 GB per rank for 7B over 8
  CHECK(host.current(mem_category::grad_shards) == 4 * numel);
  CHECK(host.current(mem_category::scratch) == 0);
  CHECK(host.total_current() > std::size_t{14'000'000'000});
  CHECK(backend.device.current(mem_category::optimizer_state) == 0);
  MESSAGE(host.report());

  CHECK_THROWS_AS(off.accumulate_grad(frozen, placeholder, layouts[frozen].shard_numel, reduce_stream), error);  // no state
  CHECK_THROWS_AS(off.accumulate_grad(w, placeholder, 5, reduce_stream), error);                              // wrong size
}

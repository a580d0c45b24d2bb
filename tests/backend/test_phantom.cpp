// The phantom backend and the null communicator: accounting without storage, collectives
// without peers, and together one engine that reads like every rank of a real run.
#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/step_schedule.hpp"
#include "../support/error_capture.hpp"

using namespace zshard;

using test_support::kind_of;

TEST_CASE("phantom backend: allocations are charged, hold nothing, and are returned by size") {
  phantom_backend b;
  void* p = b.allocate(1000, mem_category::gathered_params);
  CHECK(p == nullptr);
  CHECK(b.ledger().current(mem_category::gathered_params) == 1000);
  CHECK(b.allocate(0, mem_category::scratch) == nullptr);
  CHECK(b.ledger().total_current() == 1000);
  b.deallocate(p, 1000, mem_category::gathered_params);  // a null pointer still returns its bytes
  CHECK(b.ledger().total_current() == 0);
  CHECK(b.ledger().peak(mem_category::gathered_params) == 1000);
  CHECK(b.allocations() == 1);
  {
    buffer<phantom_backend> buf(b, dtype::bf16, 500, mem_category::grad_buckets);
    CHECK(static_cast<bool>(buf));  // alive, though its pointer is the placeholder
    CHECK(buf.data() == nullptr);
    CHECK(buf.bytes() == 1000);
    CHECK(b.ledger().current(mem_category::grad_buckets) == 1000);
  }
  CHECK(b.ledger().current(mem_category::grad_buckets) == 0);
}

TEST_CASE("phantom backend: a hard budget refuses with a budget error and changes nothing") {
  phantom_backend b(std::size_t{4096}, "phantom rank 0");
  b.allocate(4000, mem_category::sharded_params);
  std::string what;
  try {
    b.allocate(200, mem_category::activations);
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::budget);
    what = e.what();
  }
  CHECK(what.find("activations") != std::string::npos);
  CHECK(what.find("phantom rank 0") != std::string::npos);
  CHECK(what.find("4096") != std::string::npos);
  CHECK(b.ledger().total_current() == 4000);
  CHECK(b.ledger().current(mem_category::activations) == 0);
}

TEST_CASE("phantom backend: kernels, copies and streams are no-ops on placeholders") {
  phantom_backend b;
  auto s = b.make_stream();
  auto e = b.make_event();
  b.record(e, s);
  b.wait(s, e);
  b.copy(nullptr, nullptr, 1 << 20, s);
  b.fill_zero(nullptr, 1 << 20, s);
  b.convert(nullptr, dtype::f32, nullptr, dtype::bf16, 1 << 20, s);
  b.add_into(nullptr, nullptr, 1 << 20, s);
  b.adamw(optim::adamw_step{}, nullptr, nullptr, nullptr, nullptr, 1 << 20, nullptr, dtype::bf16, s);
  const grad_stats g = b.grad_stats_of(nullptr, 1 << 20, s);
  CHECK(g.sum_squares == 0.0);
  CHECK_FALSE(g.nonfinite);
  b.synchronize(s);
}

TEST_CASE("null_comm: a virtual world, argument checks of a real communicator, no data") {
  CHECK(kind_of([] { null_comm(0, 0); }) == error_kind::usage);
  CHECK(kind_of([] { null_comm(8, 8); }) == error_kind::usage);
  CHECK(kind_of([] { null_comm(-1, 2); }) == error_kind::usage);
  null_comm c(3, 8);
  CHECK(c.rank() == 3);
  CHECK(c.size() == 8);

  CHECK(kind_of([&] { c.broadcast(nullptr, 4, dtype::f32, 8); }) == error_kind::usage);
  CHECK(kind_of([&] { c.broadcast(nullptr, 4, dtype::f32, -1); }) == error_kind::usage);
  CHECK(kind_of([&] { c.reduce_scatter(nullptr, nullptr, 4, dtype::f32, reduce_op::max); }) == error_kind::usage);

  // Real buffers: overlap rules as on every communicator; in-place forms allowed.
  std::vector<float> big(8 * 4, 1.0f), small(4, 2.0f);
  CHECK(kind_of([&] { c.all_gather(big.data() + 1, big.data(), 4, dtype::f32); }) == error_kind::usage);
  c.all_gather(big.data() + 3 * 4, big.data(), 4, dtype::f32);
  CHECK(kind_of([&] { c.reduce_scatter(big.data(), big.data() + 1, 4, dtype::f32, reduce_op::sum); }) == error_kind::usage);
  c.reduce_scatter(big.data(), big.data() + 3 * 4, 4, dtype::f32, reduce_op::average);
  CHECK(kind_of([&] { c.all_reduce(big.data(), big.data() + 1, 4, dtype::f32, reduce_op::sum); }) == error_kind::usage);
  c.all_reduce(small.data(), small.data(), 4, dtype::f32, reduce_op::max);
  CHECK(small[0] == 2.0f);  // moves nothing
  c.barrier();

  // Placeholders (phantom buffers) are fine, and the volume a ring schedule would send counts.
  null_comm r0(0, 4);
  r0.all_gather(nullptr, nullptr, 100, dtype::bf16);
  r0.reduce_scatter(nullptr, nullptr, 100, dtype::f32, reduce_op::average);
  r0.all_reduce(nullptr, nullptr, 100, dtype::f32, reduce_op::sum);
  r0.broadcast(nullptr, 10, dtype::f32, 0);
  CHECK(r0.calls(null_comm::op_kind::all_gather) == 1);
  CHECK(r0.bytes_sent(null_comm::op_kind::all_gather) == 3 * 200);
  CHECK(r0.bytes_sent(null_comm::op_kind::reduce_scatter) == 3 * 400);
  CHECK(r0.bytes_sent(null_comm::op_kind::all_reduce) == 2 * 400 * 3 / 4);
  CHECK(r0.bytes_sent(null_comm::op_kind::broadcast) == 40);
  CHECK(r0.total_bytes_sent() == 600 + 1200 + 600 + 40);
}

TEST_CASE("phantom + null_comm: one engine, no storage, the run's bookkeeping") {
  const auto model = plan::build_transformer({"tiny", 2, 64, 160, 4, 2, 96, false});
  const auto schedule = plan::transformer_schedule(model, {.micro_batch = 2, .seq_len = 16, .micro_batches = 2});
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
  phantom_backend backend;
  null_comm comm(0, 8);
  engine<phantom_backend, null_comm> eng(backend, comm, model.spec, cfg);
  std::size_t sharded = 0;
  for (param_id p = 0; p < model.spec.params().size(); ++p) sharded += eng.layout(p).shard_numel * 2;
  CHECK(backend.ledger().current(mem_category::sharded_params) == sharded);
  for (int s = 0; s < 3; ++s) {
    const step_report r = plan::run_step(eng, schedule);
    CHECK(r.micro_batches == 2);
    CHECK_FALSE(r.skipped);
    CHECK(r.grad_norm == 0.0);  // no values: every statistic is zero
  }
  CHECK(eng.steps_taken() == 3);
  CHECK(backend.ledger().current(mem_category::gathered_params) == 0);
  CHECK(backend.ledger().current(mem_category::grad_buckets) == 0);
  CHECK(backend.ledger().current(mem_category::activations) == 0);
  CHECK(eng.gather_param(0).size() == model.spec.param(0).numel());  // values exist only as zeros
  CHECK(comm.total_bytes_sent() > 0);
}

TEST_CASE("phantom + null_comm reads like every rank of a real host run, category by category") {
  const auto model = plan::build_transformer({"tiny", 3, 64, 160, 4, 2, 96, true});
  const auto schedule = plan::transformer_schedule(model, {.micro_batch = 2, .seq_len = 8, .micro_batches = 2});
  engine_config cfg;
  cfg.reduce.reduce_bucket_numel = 9000;
  cfg.prefetch.prefetch_numel = 30000;
  cfg.prefetch.max_live_numel = 60000;
  cfg.partition.persistence_threshold_numel = 64;
  for (int world : {2, 3}) {
    phantom_backend pb;
    null_comm nc(0, world);
    {
      engine<phantom_backend, null_comm> eng(pb, nc, model.spec, cfg);
      for (int s = 0; s < 3; ++s) plan::run_step(eng, schedule);
    }
    std::mutex mu;
    std::vector<memory_ledger> real;
    run_ranks(world, [&](thread_comm& comm) {
      host_backend hb;
      {
        engine<host_backend, thread_comm> eng(hb, comm, model.spec, cfg);
        for (int s = 0; s < 3; ++s) plan::run_step(eng, schedule);
      }
      std::lock_guard lock(mu);
      real.push_back(hb.ledger());
    });
    for (const memory_ledger& r : real) {
      INFO("world " << world << "\nphantom:\n" << pb.ledger().report() << "host rank:\n" << r.report());
      for (std::size_t i = 0; i < mem_category_count; ++i) {
        const auto c = mem_category(i);
        // Scratch differs by the host's initial-value staging, which a phantom never does.
        if (c == mem_category::scratch) CHECK(pb.ledger().peak(c) <= r.peak(c));
        else CHECK(pb.ledger().peak(c) == r.peak(c));
      }
    }
  }
}

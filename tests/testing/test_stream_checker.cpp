// The stream-ordering race detector: it must flag each kind of unordered access (so a test
// that passes under it means something), accept the orderings CUDA accepts, and compute
// exactly what host_backend computes.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/testing/stream_checker.hpp"

using namespace zshard;
using zshard::testing::checked_backend;
using zshard::testing::checked_comm;

namespace {

bool has(const std::string& line, const std::string& part) { return line.find(part) != std::string::npos; }

std::string all(const checked_backend& b) {
  std::string s;
  for (const auto& v : b.violations()) s += v + "\n";
  return s;
}

constexpr auto compute = stream_role::compute;
constexpr auto gather = stream_role::gather;
constexpr auto reduce_role = stream_role::reduce;  // not `reduce`: zshard::reduce is a namespace
constexpr auto host_copy = stream_role::host_copy;

}  // namespace


TEST_CASE("stream checker: a compute read of a gather write needs an event") {
  checked_backend b;
  const auto g = b.role_stream(gather), c = b.role_stream(compute);
  std::vector<float> in(256, 1.5f), out(256);
  const std::size_t bytes = in.size() * sizeof(float);
  void* p = b.allocate(bytes, mem_category::gathered_params, g);
  b.copy(p, in.data(), bytes, g);

  SUBCASE("unordered: exactly one violation, naming both streams") {
    b.copy(out.data(), p, bytes, c);
    REQUIRE(b.violations().size() == 1);
    const std::string& v = b.violations()[0];
    CHECK_MESSAGE(has(v, "copy: compute read of gathered_params"), v);
    CHECK_MESSAGE(has(v, "(1024 bytes)"), v);
    CHECK_MESSAGE(has(v, "write on gather"), v);
    CHECK(out == in);  // values are still what the host schedule gives
    b.synchronize(g);  // lets the free below be ordered, so it adds nothing
  }
  SUBCASE("record on gather, wait on compute: ordered") {
    auto e = b.make_event();
    b.record(e, g);
    b.wait(c, e);
    b.copy(out.data(), p, bytes, c);
    CHECK_MESSAGE(b.violations().empty(), all(b));
  }
  SUBCASE("waiting on an event never recorded orders nothing") {
    const auto e = b.make_event();
    b.wait(c, e);
    b.copy(out.data(), p, bytes, c);
    CHECK(b.violations().size() == 1);
    b.synchronize(g);
  }
  SUBCASE("an event recorded before the write does not order it") {
    auto e = b.make_event();
    b.record(e, g);
    b.fill_zero(p, bytes, g);
    b.wait(c, e);
    b.note_access(p, bytes, false, compute);
    REQUIRE(b.violations().size() == 1);
    CHECK(has(b.violations()[0], "note_access: compute read"));
    b.synchronize(g);
  }
  const std::size_t before = b.violations().size();
  b.deallocate(p, bytes, mem_category::gathered_params, c);
  CHECK_MESSAGE(b.violations().size() == before, all(b));
  CHECK(b.ledger().total_current() == 0);
}

TEST_CASE("stream checker: freeing on compute what gather wrote needs ordering") {
  checked_backend b;
  const auto g = b.role_stream(gather);
  std::vector<float> in(64, 2.0f);
  void* p = b.allocate(256, mem_category::gathered_params, g);
  b.copy(p, in.data(), 256, g);
  b.deallocate(p, 256, mem_category::gathered_params);  // the 2-argument form frees on compute
  REQUIRE(b.violations().size() == 1);
  const std::string& v = b.violations()[0];
  CHECK_MESSAGE(has(v, "deallocate: compute write of gathered_params"), v);
  CHECK_MESSAGE(has(v, "write on gather"), v);
  CHECK(b.ledger().total_current() == 0);  // freed all the same

  // Freed on the stream that wrote it: ordered by stream order alone.
  void* q = b.allocate(256, mem_category::gathered_params, g);
  b.copy(q, in.data(), 256, g);
  b.deallocate(q, 256, mem_category::gathered_params, g);
  CHECK(b.violations().size() == 1);
}

TEST_CASE("stream checker: a write must be ordered after every read since the last write") {
  checked_backend b;
  const auto c = b.role_stream(compute), g = b.role_stream(gather), r = b.role_stream(reduce_role),
             h = b.role_stream(host_copy);
  void* p = b.allocate(512, mem_category::grad_buckets, c);
  b.fill_zero(p, 512, c);
  auto written = b.make_event();
  b.record(written, c);
  b.wait(g, written);
  b.wait(r, written);
  // Two concurrent readers: fine, reads do not conflict with each other.
  b.note_access(p, 512, false, gather);
  b.note_access(p, 512, false, reduce_role);
  CHECK_MESSAGE(b.violations().empty(), all(b));
  auto after_gather = b.make_event(), after_reduce = b.make_event();
  b.record(after_gather, g);
  b.record(after_reduce, r);
  b.wait(h, after_gather);

  SUBCASE("ordered after one reader only") {
    b.fill_zero(p, 512, h);
    REQUIRE(b.violations().size() == 1);
    const std::string& v = b.violations()[0];
    CHECK_MESSAGE(has(v, "fill_zero: host_copy write of grad_buckets"), v);
    CHECK_MESSAGE(has(v, "read on reduce"), v);
  }
  SUBCASE("ordered after both readers") {
    b.wait(h, after_reduce);
    b.fill_zero(p, 512, h);
    CHECK_MESSAGE(b.violations().empty(), all(b));
  }
  b.synchronize(h);
  b.synchronize(g);
  b.synchronize(r);
  const std::size_t before = b.violations().size();
  b.deallocate(p, 512, mem_category::grad_buckets, c);
  CHECK(b.violations().size() == before);
}

TEST_CASE("stream checker: what the host waited for is ordered before what it enqueues next") {
  checked_backend b;
  const auto c = b.role_stream(compute), g = b.role_stream(gather), r = b.role_stream(reduce_role);
  std::vector<float> in(32, 0.5f), out(32);
  auto* p = static_cast<float*>(b.allocate(128, mem_category::grad_shards, g));
  b.copy(p, in.data(), 128, g);
  b.synchronize(g);
  b.copy(out.data(), p, 128, c);  // no event: the host saw gather finish before enqueueing this
  CHECK_MESSAGE(b.violations().empty(), all(b));

  // grad_stats_of is synchronous: later work on any stream is ordered after it and what preceded it.
  b.add_into(p, in.data(), 32, r);
  CHECK(b.violations().size() == 1);  // reduce was never ordered after compute's read
  const grad_stats st = b.grad_stats_of(p, 32, r);
  CHECK(st.sum_squares == doctest::Approx(32.0));
  b.fill_zero(p, 128, c);
  b.deallocate(p, 128, mem_category::grad_shards, g);  // the host never waited for compute's fill_zero
  REQUIRE_MESSAGE(b.violations().size() == 2, all(b));
  CHECK(has(b.violations()[1], "deallocate: gather write of grad_shards"));
  CHECK(has(b.violations()[1], "write on compute"));
}

TEST_CASE("stream checker: a collective bound to the gather stream, read on compute") {
  for (const bool ordered : {false, true}) {
    CAPTURE(ordered);
    constexpr int world = 2;
    constexpr std::size_t n = 8;
    std::array<std::vector<std::string>, world> found;
    std::array<std::vector<float>, world> got;
    std::array<std::size_t, world> seen{};
    run_ranks(world, [&](thread_comm& comm) {
      checked_backend b;
      checked_comm<thread_comm> cc(comm, b);
      const auto g = b.role_stream(gather), c = b.role_stream(compute);
      const auto gs = comm_stream::of(g);
      const std::vector<float> mine(n, static_cast<float>(comm.rank() + 1));
      void* src = b.allocate(n * sizeof(float), mem_category::sharded_params, g);
      void* dst = b.allocate(world * n * sizeof(float), mem_category::gathered_params, g);
      b.copy(src, mine.data(), n * sizeof(float), g);
      cc.all_gather(src, dst, n, dtype::f32, gs);
      if (ordered) {
        auto e = b.make_event();
        b.record(e, g);
        b.wait(c, e);
      }
      std::vector<float> out(world * n);
      b.copy(out.data(), dst, out.size() * sizeof(float), c);
      b.synchronize(c);
      b.deallocate(src, n * sizeof(float), mem_category::sharded_params, g);
      b.deallocate(dst, world * n * sizeof(float), mem_category::gathered_params, g);
      const auto r = static_cast<std::size_t>(comm.rank());
      found[r] = b.violations();
      got[r] = out;
      seen[r] = b.checked_accesses();
    });
    for (std::size_t r = 0; r < world; ++r) {
      CAPTURE(r);
      for (std::size_t i = 0; i < world * n; ++i) CHECK(got[r][i] == static_cast<float>(i / n + 1));
      CHECK(seen[r] == 8);  // 2 allocations, copy in, all_gather's read and write, copy out, 2 frees
      if (ordered) {
        CHECK(found[r].empty());
      } else {
        REQUIRE(found[r].size() == 1);
        CHECK_MESSAGE(has(found[r][0], "copy: compute read of gathered_params"), found[r][0]);
        CHECK_MESSAGE(has(found[r][0], "write on gather"), found[r][0]);
      }
    }
  }
}

TEST_CASE("stream checker: collectives in a group run at group_end, as NCCL launches a group") {
  constexpr int world = 3;
  constexpr std::size_t n = 4;
  std::array<std::vector<float>, world> inside, after;
  std::array<std::size_t, world> groups{};
  run_ranks(world, [&](thread_comm& comm) {
    checked_backend b;
    checked_comm<thread_comm> cc(comm, b);
    const auto g = b.role_stream(gather);
    const auto gs = comm_stream::of(g);
    std::vector<float> src(2 * n, static_cast<float>(comm.rank() + 1)), dst(2 * world * n, -1.0f);
    cc.group_start();
    cc.group_start();  // nested: only the outermost end launches
    cc.all_gather(src.data(), dst.data(), n, dtype::f32, gs);
    cc.all_gather(src.data() + n, dst.data() + world * n, n, dtype::f32, gs);
    cc.group_end();
    const auto r = static_cast<std::size_t>(comm.rank());
    inside[r] = dst;  // nothing ran yet
    CHECK_THROWS_AS(cc.barrier(), error);
    cc.group_end();
    after[r] = dst;
    groups[r] = cc.groups_launched();
    CHECK_THROWS_AS(cc.group_end(), error);  // unbalanced
  });
  for (std::size_t r = 0; r < world; ++r) {
    for (float x : inside[r]) CHECK(x == -1.0f);
    for (std::size_t i = 0; i < after[r].size(); ++i)
      CHECK(after[r][i] == static_cast<float>((i % (world * n)) / n + 1));
    CHECK(groups[r] == 1);
  }
}

TEST_CASE("stream checker: a reduce-scatter on the reduce stream must wait for backward") {
  constexpr int world = 2;
  constexpr std::size_t n = 4;
  std::array<std::vector<std::string>, world> found;
  std::array<std::vector<float>, world> got;
  run_ranks(world, [&](thread_comm& comm) {
    checked_backend b;
    checked_comm<thread_comm> cc(comm, b);
    const auto c = b.role_stream(compute), r = b.role_stream(reduce_role);
    std::vector<float> grads(world * n, 1.0f), shard(n);
    void* full = b.allocate(world * n * sizeof(float), mem_category::grad_buckets, c);
    void* mine = b.allocate(n * sizeof(float), mem_category::grad_shards, c);
    b.copy(full, grads.data(), world * n * sizeof(float), c);  // "backward" wrote it on compute
    auto e = b.make_event();
    b.record(e, c);
    const auto rs = comm_stream::of(r);
    cc.reduce_scatter(full, mine, n, dtype::f32, reduce_op::sum, rs);  // unordered: reads full, writes mine
    b.wait(r, e);
    cc.all_reduce(mine, mine, n, dtype::f32, reduce_op::sum, rs);  // ordered now
    b.synchronize(r);
    b.copy(shard.data(), mine, n * sizeof(float), c);
    b.deallocate(full, world * n * sizeof(float), mem_category::grad_buckets, c);
    b.deallocate(mine, n * sizeof(float), mem_category::grad_shards, c);
    found[static_cast<std::size_t>(comm.rank())] = b.violations();
    got[static_cast<std::size_t>(comm.rank())] = shard;
  });
  for (std::size_t q = 0; q < world; ++q) {
    CHECK(got[q] == std::vector<float>(n, 4.0f));
    REQUIRE(found[q].size() == 2);  // full's read, and mine's write (allocated on compute)
    CHECK(has(found[q][0], "reduce_scatter: reduce read of grad_buckets"));
    CHECK(has(found[q][1], "reduce_scatter: reduce write of grad_shards"));
    CHECK(has(found[q][1], "write on compute"));
  }
}

TEST_CASE("stream checker: results equal host_backend's") {
  checked_backend b;
  host_backend h;
  const auto s = b.make_stream();
  auto hs = h.make_stream();
  std::mt19937 rng(20240917);
  std::normal_distribution<float> normal;
  constexpr std::size_t n = 1031;
  const auto random = [&] {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const std::vector<float> a = random(), g = random(), master0 = random(), m0 = random();
  std::vector<float> v0 = random();
  for (float& x : v0) x = x * x;
  constexpr std::size_t bytes = n * sizeof(float);
  const auto on_checked = [&](const std::vector<float>& from) {
    auto* p = static_cast<float*>(b.allocate(bytes, mem_category::scratch, s));
    b.copy(p, from.data(), bytes, s);
    return p;
  };
  const auto back = [&](const void* p, std::size_t count) {
    std::vector<float> out(count);
    b.copy(out.data(), p, count * sizeof(float), s);
    return out;
  };

  float *ca = on_checked(a), *cg = on_checked(g), *cmaster = on_checked(master0), *cm = on_checked(m0),
        *cv = on_checked(v0), *ccopy = on_checked(g);
  auto* half = static_cast<bf16*>(b.allocate(n * sizeof(bf16), mem_category::scratch, s));
  auto* work = static_cast<bf16*>(b.allocate(n * sizeof(bf16), mem_category::scratch, s));
  std::vector<float> ha = a, hmaster = master0, hm = m0, hv = v0, hcopy(n);
  std::vector<bf16> hhalf(n), hwork(n);

  b.copy(ccopy, ca, bytes, s);
  h.copy(hcopy.data(), a.data(), bytes, hs);
  b.convert(ca, dtype::f32, half, dtype::bf16, n, s);
  h.convert(a.data(), dtype::f32, hhalf.data(), dtype::bf16, n, hs);
  b.add_into(ca, cg, n, s);
  h.add_into(ha.data(), g.data(), n, hs);
  const auto step = optim::make_adamw_step(optim::adamw_config{}, 3, 0.5f, true);
  b.adamw(step, cmaster, cm, cv, cg, n, work, dtype::bf16, s);
  h.adamw(step, hmaster.data(), hm.data(), hv.data(), g.data(), n, hwork.data(), dtype::bf16, hs);
  const grad_stats bst = b.grad_stats_of(cg, n, s), hst = h.grad_stats_of(g.data(), n, hs);

  CHECK(back(ccopy, n) == hcopy);
  CHECK(back(ca, n) == ha);
  CHECK(back(cmaster, n) == hmaster);
  CHECK(back(cm, n) == hm);
  CHECK(back(cv, n) == hv);
  std::vector<bf16> bhalf(n), bwork(n);
  b.copy(bhalf.data(), half, n * sizeof(bf16), s);
  b.copy(bwork.data(), work, n * sizeof(bf16), s);
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(bhalf[i].bits == hhalf[i].bits);
    REQUIRE(bwork[i].bits == hwork[i].bits);
  }
  CHECK(bst.sum_squares == hst.sum_squares);
  CHECK(bst.nonfinite == hst.nonfinite);
  b.fill_zero(ca, bytes, s);
  CHECK(back(ca, n) == std::vector<float>(n, 0.0f));

  for (float* p : {ca, cg, cmaster, cm, cv, ccopy}) b.deallocate(p, bytes, mem_category::scratch, s);
  for (bf16* p : {half, work}) b.deallocate(p, n * sizeof(bf16), mem_category::scratch, s);
  CHECK_MESSAGE(b.violations().empty(), all(b));  // one stream: everything is ordered
  CHECK(b.ledger().total_current() == 0);
}

TEST_CASE("stream checker: only accesses to live allocations are checked") {
  checked_backend b;
  const auto c = b.role_stream(compute), g = b.role_stream(gather);
  std::vector<float> x(16, 1.0f), y(16);
  b.copy(y.data(), x.data(), 64, g);  // host memory on two streams, never ordered: not ours
  b.copy(x.data(), y.data(), 64, c);
  b.note_access(x.data(), 64, true, reduce_role);
  CHECK(b.checked_accesses() == 0);
  CHECK(b.violations().empty());

  auto* p = static_cast<std::byte*>(b.allocate(100, mem_category::activations, c));
  CHECK(b.checked_accesses() == 1);         // the allocation is a write
  b.note_access(p + 40, 8, true, compute);  // inside: counted
  b.note_access(p + 100, 8, true, gather);  // one past the end: not this allocation
  b.note_access(nullptr, 8, true, gather);
  b.note_access(p, 0, true, gather);
  CHECK(b.checked_accesses() == 2);
  CHECK_MESSAGE(b.violations().empty(), all(b));

  b.note_access(p + 96, 8, false, compute);  // starts inside, runs past the end
  CHECK(b.checked_accesses() == 3);
  REQUIRE(b.violations().size() == 1);
  CHECK_MESSAGE(has(b.violations()[0], "runs 4 bytes past its end"), b.violations()[0]);

  b.deallocate(p, 100, mem_category::activations);
  b.note_access(p, 8, true, gather);  // freed: no longer tracked
  CHECK(b.checked_accesses() == 4);
  CHECK(b.violations().size() == 1);

  for (int i = 0; i < 60; ++i) b.deallocate(x.data(), 4, mem_category::scratch);  // never allocated here
  CHECK(b.violations().size() == checked_backend::max_violations);
}

TEST_CASE("stream checker: memory is aligned and charged like host_backend") {
  checked_backend b(4096, "rank 0 device");
  host_backend h(4096);
  const auto g = b.role_stream(gather);
  CHECK(b.ledger().name() == "rank 0 device");
  CHECK(b.allocate(0, mem_category::scratch) == nullptr);
  std::vector<std::pair<void*, void*>> both;
  for (std::size_t bytes : {1u, 63u, 64u, 1000u}) {
    void* p = b.allocate(bytes, mem_category::gathered_params, g);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % checked_backend::alignment == 0);
    both.emplace_back(p, h.allocate(bytes, mem_category::gathered_params));
    CHECK(b.ledger().current(mem_category::gathered_params) == h.ledger().current(mem_category::gathered_params));
  }
  CHECK(b.ledger().total_current() == 1 + 63 + 64 + 1000);
  CHECK_THROWS_AS(b.allocate(3000, mem_category::optimizer_state), zshard::error);
  try {
    b.allocate(3000, mem_category::optimizer_state);
  } catch (const zshard::error& e) {
    CHECK(e.kind() == error_kind::budget);
  }
  CHECK(b.ledger().total_current() == 1128);  // a refused request changes nothing
  const std::size_t sizes[] = {1, 63, 64, 1000};
  for (std::size_t i = 0; i < both.size(); ++i) {
    b.deallocate(both[i].first, sizes[i], mem_category::gathered_params, g);
    h.deallocate(both[i].second, sizes[i], mem_category::gathered_params);
    CHECK(b.ledger().current(mem_category::gathered_params) == h.ledger().current(mem_category::gathered_params));
  }
  CHECK(b.ledger().total_current() == 0);
  CHECK(b.ledger().peak(mem_category::gathered_params) == h.ledger().peak(mem_category::gathered_params));
  CHECK_MESSAGE(b.violations().empty(), all(b));
  CHECK_THROWS_AS(b.copy(nullptr, nullptr, 0, checked_backend::stream{7}), zshard::error);
}

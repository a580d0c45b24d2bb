#pragma once
// Test cases of the NCCL communicator; part of test_cuda.cu's single translation unit.
//
// Values are small integers (exact in bf16 and f16, and their sums too), so results can be
// compared exactly whatever order NCCL reduces in; average is compared within rounding
// because NCCL may pre-multiply by 1/n instead of dividing.

namespace nccl_cases {

using zshard::nccl_comm;
using zshard::reduce_op;

// Value of element i on rank r: a small integer.
inline float value(int r, std::size_t i) { return float((r + 1) * (int(i % 7) - 3)); }

// A device buffer of `n` elements of type t holding host floats, and back.
struct typed_buffer {
  zshard::buffer<zshard::cuda_backend> buf;
  dtype type;
  typed_buffer(zshard::cuda_backend& b, dtype t, const std::vector<float>& host)
      : buf(b, t, host.size(), mem_category::scratch), type(t) {
    gpu_test::device_array<float> wide(b, host);
    b.convert(wide.ptr, dtype::f32, buf.data(), t, host.size(), b.make_stream());
    b.synchronize(b.make_stream());
  }
  std::vector<float> to_host(zshard::cuda_backend& b) const {
    gpu_test::device_array<float> wide(b, std::vector<float>(buf.numel()));
    b.convert(buf.data(), type, wide.ptr, dtype::f32, buf.numel(), b.make_stream());
    return wide.to_host(b);
  }
  void* data() const { return buf.data(); }
};

inline void check_close(const std::vector<float>& got, const std::vector<float>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]) + 1e-30);
}

// Every collective of `c` on every dtype against serial references computed on the host.
inline void check_collectives(nccl_comm& c, zshard::cuda_backend& b, std::size_t count) {
  const int w = c.size(), r = c.rank();
  const auto uw = static_cast<std::size_t>(w);
  const auto cs = zshard::comm_stream::of(b.make_stream());  // one in-order queue with the backend's copies
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    INFO("dtype " << zshard::to_string(t) << ", rank " << r << " of " << w);
    const double avg_tol = t == dtype::f32 ? 1e-6 : t == dtype::bf16 ? 1.0 / 128 : 1.0 / 1024;
    std::vector<float> mine(count), full(count * uw), want(count * uw);
    for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
    for (std::size_t i = 0; i < count * uw; ++i) full[i] = value(r, i);

    typed_buffer src(b, t, mine), dst(b, t, std::vector<float>(count * uw));
    c.all_gather(src.data(), dst.data(), count, t, cs);
    for (int q = 0; q < w; ++q)
      for (std::size_t i = 0; i < count; ++i) want[std::size_t(q) * count + i] = value(q, i);
    CHECK(dst.to_host(b) == want);

    typed_buffer big(b, t, full), shard(b, t, std::vector<float>(count));
    std::vector<float> sum(count);
    for (std::size_t i = 0; i < count; ++i)
      for (int q = 0; q < w; ++q) sum[i] += value(q, std::size_t(r) * count + i);
    c.reduce_scatter(big.data(), shard.data(), count, t, reduce_op::sum, cs);
    CHECK(shard.to_host(b) == sum);
    c.reduce_scatter(big.data(), shard.data(), count, t, reduce_op::average, cs);
    std::vector<float> avg = sum;
    for (float& x : avg) x /= float(w);
    check_close(shard.to_host(b), avg, avg_tol);

    std::vector<float> all(count), mx(count, -1e30f);
    for (std::size_t i = 0; i < count; ++i)
      for (int q = 0; q < w; ++q) all[i] += value(q, i), mx[i] = std::max(mx[i], value(q, i));
    typed_buffer inplace(b, t, mine);
    c.all_reduce(inplace.data(), inplace.data(), count, t, reduce_op::sum, cs);
    CHECK(inplace.to_host(b) == all);
    typed_buffer m2(b, t, mine);
    c.all_reduce(m2.data(), m2.data(), count, t, reduce_op::max, cs);
    CHECK(m2.to_host(b) == mx);

    typed_buffer bc(b, t, mine);
    c.broadcast(bc.data(), count, t, w - 1, cs);
    std::vector<float> root(count);
    for (std::size_t i = 0; i < count; ++i) root[i] = value(w - 1, i);
    CHECK(bc.to_host(b) == root);

    // in place, and several tensors in one group
    typed_buffer ip(b, t, std::vector<float>(count * uw));
    b.copy(static_cast<unsigned char*>(ip.data()) + std::size_t(r) * count * zshard::size_of(t), src.data(),
           count * zshard::size_of(t), b.make_stream());
    typed_buffer g2(b, t, std::vector<float>(count * uw));
    c.group_start();
    c.all_gather(static_cast<unsigned char*>(ip.data()) + std::size_t(r) * count * zshard::size_of(t), ip.data(), count,
                 t, cs);
    c.all_gather(src.data(), g2.data(), count, t, cs);
    c.group_end();
    CHECK(ip.to_host(b) == want);
    CHECK(g2.to_host(b) == want);
  }
  c.barrier(cs);
  c.synchronize(cs);
}

}  // namespace nccl_cases

TEST_CASE("nccl_comm, one rank: every collective and dtype, both completion modes, usage errors") {
  auto comms = nccl_comm::create_local(std::vector<int>{0});
  auto& c = comms.front();
  zshard::cuda_backend b;
  for (auto mode : {zshard::nccl_completion::wait, zshard::nccl_completion::enqueue}) {
    c.set_completion(mode);
    nccl_cases::check_collectives(c, b, 1001);
  }
  gpu_test::device_array<float> x(b, std::vector<float>(8, 1.0f));
  const auto kind_of = [](auto&& f) {
    try {
      f();
    } catch (const zshard::error& e) {
      return e.kind();
    }
    return zshard::error_kind::invariant;  // "did not throw"
  };
  CHECK(kind_of([&] { c.all_gather(nullptr, x.ptr, 4, dtype::f32); }) == zshard::error_kind::usage);
  CHECK(kind_of([&] { c.reduce_scatter(x.ptr, x.ptr, 8, dtype::f32, zshard::reduce_op::max); }) ==
        zshard::error_kind::usage);
  CHECK(kind_of([&] { c.broadcast(x.ptr, 8, dtype::f32, 1); }) == zshard::error_kind::usage);
  CHECK(kind_of([&] { c.all_reduce(x.ptr, x.ptr + 1, 4, dtype::f32, zshard::reduce_op::sum); }) ==
        zshard::error_kind::usage);
  CHECK_NOTHROW(c.all_reduce(nullptr, nullptr, 0, dtype::f32, zshard::reduce_op::sum));
  c.synchronize();
  c.abort("test");
  CHECK(kind_of([&] { c.barrier(); }) == zshard::error_kind::comm);
}

TEST_CASE("nccl_comm across this process's GPUs (one thread per GPU): collectives against serial references") {
  const int n = std::min(gpu_test::device_count(), 8);
  if (n < 2) {
    MESSAGE("one GPU: the multi-rank NCCL checks need at least two (not run)");
    return;
  }
  zshard::run_nccl_ranks(gpu_test::devices(n), [&](nccl_comm& c) {
    zshard::cuda_backend b({.device = c.device()});
    nccl_cases::check_collectives(c, b, 1003);
  });
}

TEST_CASE("nccl_comm: a rank that fails or skips a collective stops the others with an error, never a hang") {
  if (gpu_test::device_count() < 2) {
    MESSAGE("one GPU: the peer-failure checks need at least two (not run)");
    return;
  }
  zshard::nccl_options o;
  o.timeout = std::chrono::milliseconds(2000);
  for (bool rank1_throws : {true, false}) {
    const std::string label = rank1_throws ? "rank 1 throws" : "rank 1 skips the collective";
    INFO(label);
    const auto start = std::chrono::steady_clock::now();
    try {
      zshard::run_nccl_ranks(
          gpu_test::devices(2),
          [&](nccl_comm& c) {
            zshard::cuda_backend b({.device = c.device(), .sync_timeout = std::chrono::milliseconds(5000)});
            const auto cs = zshard::comm_stream::of(b.make_stream());
            gpu_test::device_array<float> x(b, std::vector<float>(1024, 1.0f));
            if (c.rank() == 1) {
              if (rank1_throws) throw std::runtime_error("rank 1 gives up");
              return;
            }
            c.all_reduce(x.ptr, x.ptr, 1024, dtype::f32, zshard::reduce_op::sum, cs);
          },
          o);
      FAIL("no error");
    } catch (const zshard::error& e) {
      CHECK_FALSE(rank1_throws);
      CHECK(e.kind() == zshard::error_kind::comm);
      CHECK(std::string(e.what()).find("did not complete within 2000 ms") != std::string::npos);
    } catch (const std::runtime_error& e) {
      CHECK(rank1_throws);
      CHECK(std::string(e.what()) == "rank 1 gives up");  // the root cause, not the peer's abort
    }
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  }
}

// Run as its own ctest entry (test_cuda_hang): if NCCL could not abort a pending init, only
// that entry would time out.
TEST_CASE("hang: an NCCL world waiting for a rank that never comes fails within the timeout") {
  zshard::nccl_options o;
  o.timeout = std::chrono::milliseconds(3000);
  const auto id = nccl_comm::make_unique_id();
  const auto start = std::chrono::steady_clock::now();
  try {
    nccl_comm c(id, 2, 0, 0, o);
    FAIL("a world of 2 formed with one rank");
  } catch (const zshard::error& e) {
    CHECK(e.kind() == zshard::error_kind::comm);
    CHECK(std::string(e.what()).find("did not complete within 3000 ms") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

#pragma once
// What a first GPU run would otherwise hit (issue 18), on the device: host waits that poll
// instead of blocking in the driver, NCCL errors and cancellations that end them, teardown that
// aborts, peer failures in enqueue mode, reductions on a second communicator, and backend calls
// from another device's thread. Part of test_cuda.cu's single translation unit (spin_kernel is
// defined there). The CPU counterparts: tests/core/test_host_wait.cpp, tests/engine/
// test_async_waits.cpp, test_reduce_comm.cpp, test_error_frees.cpp.

namespace readiness_cases {

// A one-rank NCCL world on device 0 (runs on a single GPU).
inline zshard::nccl_comm one_rank(zshard::nccl_options o = {}) {
  const int dev[1] = {0};
  auto comms = zshard::nccl_comm::create_local(dev, o);
  return std::move(comms.front());
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// How promptly a watched wait ends. The wait runs the watch at its first poll and between all
// later ones (core/host_wait.hpp: it yields for the first 2000 polls, then sleeps 50 us), so the
// error is seen within microseconds: `detected` is the start of the poll that saw it. Ending the
// wait also aborts the communicator, and ncclCommAbort frees NCCL's device memory, which waits
// for the work queued on the device: here the 3 s stand-in for a hung collective, a plain kernel
// the abort cannot stop (a real hung NCCL kernel is what the abort ends). So the wait returns
// when that kernel is done (3.04 s on an H200, issue 24), not at the 30 s timeout: the bound is
// the kernel's own time plus a second.
struct prompt_wait {
  std::chrono::steady_clock::time_point launched, start, detected{}, ended;
  double kernel_s = 0;
  void check(const char* what) const {
    const double detect = std::chrono::duration<double>(detected - start).count();
    const double total = std::chrono::duration<double>(ended - start).count();
    MESSAGE(what << ": error seen after " << detect << " s; the wait ended after " << total
                 << " s (the stuck kernel ran " << kernel_s << " s)");
    CHECK(detected >= start);
    CHECK(detect < 0.5);
    CHECK(total < kernel_s + 1.0);
  }
};

}  // namespace readiness_cases

TEST_CASE("readiness: a copy into pageable host memory behind a stuck stream times out instead of blocking") {
  zshard::cuda_backend b({.sync_timeout = std::chrono::milliseconds(200)});
  auto s = b.make_stream();
  gpu_test::device_array<float> x(b, std::vector<float>(256, 2.0f));
  b.synchronize(s);
  spin_kernel<<<1, 1, 0, s.handle()>>>(3'000'000'000ull);  // ~3 s: a collective that hangs
  std::vector<float> host(256);
  const auto start = std::chrono::steady_clock::now();
  try {
    b.copy(host.data(), x.ptr, 256 * sizeof(float), s);  // pageable: the driver would block ~3 s
    FAIL("the copy waited for the stuck stream");
  } catch (const zshard::error& e) {
    CHECK(e.kind() == zshard::error_kind::backend);
    CHECK(std::string(e.what()).find("did not finish within 200 ms") != std::string::npos);
  }
  CHECK(readiness_cases::seconds_since(start) < 2.0);
  ZSHARD_CUDA_CHECK(cudaStreamSynchronize(s.handle()));
  b.copy(host.data(), x.ptr, 256 * sizeof(float), s);  // now it goes through
  CHECK(host[255] == 2.0f);
}

TEST_CASE("readiness: an NCCL error (fake, through the test seam) ends a backend wait at once, and aborts") {
  zshard::cuda_backend b({.sync_timeout = std::chrono::milliseconds(30'000)});
  auto c = readiness_cases::one_rank();
  readiness_cases::prompt_wait w;
  const auto handle = b.watch().add([&] {
    w.detected = std::chrono::steady_clock::now();
    c.poll_health("cuda_backend::synchronize");
  });
  auto s = b.make_stream();
  w.launched = std::chrono::steady_clock::now();
  spin_kernel<<<1, 1, 0, s.handle()>>>(3'000'000'000ull);
  c.inject_async_error_for_testing(ncclRemoteError);
  w.start = std::chrono::steady_clock::now();
  try {
    b.synchronize(s);
    FAIL("synchronize returned");
  } catch (const zshard::error& e) {
    CHECK(e.kind() == zshard::error_kind::comm);
    CHECK(std::string(e.what()).find("cuda_backend::synchronize") != std::string::npos);
  }
  w.ended = std::chrono::steady_clock::now();
  CHECK(c.aborted());
  b.watch().remove(handle);
  ZSHARD_CUDA_CHECK(cudaStreamSynchronize(s.handle()));
  w.kernel_s = readiness_cases::seconds_since(w.launched);
  w.check("NCCL error");
}

TEST_CASE("readiness: a peer's cancellation ends a backend wait at once") {
  std::atomic<bool> cancel{false};
  zshard::nccl_options o;
  o.cancel = &cancel;
  zshard::cuda_backend b({.sync_timeout = std::chrono::milliseconds(30'000)});
  auto c = readiness_cases::one_rank(o);
  readiness_cases::prompt_wait w;
  const auto handle = b.watch().add([&] {
    w.detected = std::chrono::steady_clock::now();
    c.poll_health();
  });
  auto s = b.make_stream();
  w.launched = std::chrono::steady_clock::now();
  spin_kernel<<<1, 1, 0, s.handle()>>>(3'000'000'000ull);
  cancel.store(true);
  w.start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(b.synchronize(s), doctest::Contains("aborted because a peer rank failed"), zshard::error);
  w.ended = std::chrono::steady_clock::now();
  CHECK(c.stopped_by_peer());
  b.watch().remove(handle);
  ZSHARD_CUDA_CHECK(cudaStreamSynchronize(s.handle()));
  w.kernel_s = readiness_cases::seconds_since(w.launched);
  w.check("peer cancellation");
}

TEST_CASE("readiness: teardown does not wait for a stuck stream") {
  const auto start = std::chrono::steady_clock::now();
  cudaStream_t stuck = nullptr;
  {
    zshard::cuda_backend b({.sync_timeout = std::chrono::milliseconds(30'000)});
    auto s = b.make_stream();
    stuck = s.handle();
    spin_kernel<<<1, 1, 0, stuck>>>(2'000'000'000ull);
  }  // the old destructor waited (up to sync_timeout per stream)
  CHECK(readiness_cases::seconds_since(start) < 1.0);
  ZSHARD_CUDA_CHECK(cudaDeviceSynchronize());  // the kernel drains; CUDA released the stream then
}

TEST_CASE("readiness: an engine with a second communicator for reductions equals the reference") {
  for (int world : engine_cases::worlds()) {
    for (auto mode : {zshard::nccl_completion::wait, zshard::nccl_completion::enqueue}) {
      auto o = engine_cases::base(world);
      o.micro_batches = 2;
      const std::string what = "reduce communicator, world " + std::to_string(world) + ", " + engine_cases::name(mode);
      engine_cases::check_equal(gpu_test::train_on_gpus(o, mode, /*separate_reduce=*/true), toy::train_reference(o),
                                dtype::f32, what);
    }
  }
}

TEST_CASE("readiness: finalize_all and create_local leave the caller's device current") {
  const int n = std::min(gpu_test::device_count(), 2);
  ZSHARD_CUDA_CHECK(cudaSetDevice(n - 1));
  {
    auto comms = zshard::nccl_comm::create_local(gpu_test::devices(n));
    int current = -1;
    ZSHARD_CUDA_CHECK(cudaGetDevice(&current));
    CHECK(current == n - 1);
    zshard::nccl_comm::finalize_all(comms);
    ZSHARD_CUDA_CHECK(cudaGetDevice(&current));
    CHECK(current == n - 1);
  }
  ZSHARD_CUDA_CHECK(cudaSetDevice(0));
}

TEST_CASE("readiness: backend calls from a thread whose current device is another one") {
  if (gpu_test::device_count() < 2) {
    MESSAGE("one GPU: the device-switching check needs two (not run)");
    return;
  }
  zshard::cuda_backend b1({.device = 1});
  ZSHARD_CUDA_CHECK(cudaSetDevice(0));
  zshard::buffer<zshard::cuda_backend> x(b1, dtype::f32, 1000, mem_category::scratch);
  auto s = b1.make_stream();
  ZSHARD_CUDA_CHECK(cudaSetDevice(0));
  b1.fill_zero(x.data(), x.bytes(), s);
  ZSHARD_CUDA_CHECK(cudaSetDevice(0));
  auto e = b1.make_event();
  b1.record(e, s);
  b1.wait(b1.role_stream(zshard::stream_role::gather), e);
  ZSHARD_CUDA_CHECK(cudaSetDevice(0));
  std::vector<float> host(1000, 1.0f);
  b1.copy(host.data(), x.data(), x.bytes(), s);
  b1.synchronize(s);
  CHECK(std::all_of(host.begin(), host.end(), [](float v) { return v == 0.0f; }));
  ZSHARD_CUDA_CHECK(cudaSetDevice(0));
}

TEST_CASE("readiness: in enqueue mode, a rank that throws mid-step stops the others, never a hang") {
  if (gpu_test::device_count() < 2) {
    MESSAGE("one GPU: the enqueue-mode peer-failure checks need two (not run)");
    return;
  }
  for (bool in_engine : {false, true}) {
    INFO((in_engine ? "inside the engine's step" : "between enqueued collectives"));
    zshard::nccl_options o;
    o.timeout = std::chrono::milliseconds(20'000);  // the peers must stop long before it
    const auto start = std::chrono::steady_clock::now();
    try {
      zshard::run_nccl_ranks(
          gpu_test::devices(2),
          [&](nccl_comm& c) {
            c.set_completion(zshard::nccl_completion::enqueue);
            zshard::cuda_backend b({.device = c.device(), .sync_timeout = std::chrono::milliseconds(20'000)});
            if (!in_engine) {
              const auto handle = b.watch().add([&] { c.poll_health(); });
              const auto cs = zshard::comm_stream::of(b.make_stream());
              gpu_test::device_array<float> x(b, std::vector<float>(1 << 20, 1.0f));
              c.all_reduce(x.ptr, x.ptr, 1 << 20, dtype::f32, zshard::reduce_op::sum, cs);
              if (c.rank() == 1) throw std::runtime_error("rank 1 gives up");
              c.all_reduce(x.ptr, x.ptr, 1 << 20, dtype::f32, zshard::reduce_op::sum, cs);  // waits for rank 1
              const auto host = x.to_host(b);                                               // a host wait
              b.watch().remove(handle);
              return;
            }
            toy::ids id;
            auto opts = engine_cases::base(2);
            zshard::engine<zshard::cuda_backend, nccl_comm> eng(b, c, toy::make_spec(opts.model, id), opts.engine);
            for (zshard::module_id m = 0; m < eng.spec().modules().size(); ++m) auto g = eng.forward(m);
            eng.begin_backward();
            for (std::size_t m = eng.spec().modules().size(); m-- > 0;) {
              if (c.rank() == 1 && m == 1) throw std::runtime_error("rank 1 gives up");
              auto g = eng.backward(m);
            }
            eng.end_backward();
            eng.step();  // rank 0 waits here for a rank that is gone
          },
          o);
      FAIL("no error");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "rank 1 gives up");  // the root cause, not the peer's abort
    }
    CHECK(readiness_cases::seconds_since(start) < 15.0);
  }
}

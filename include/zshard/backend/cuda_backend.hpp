#pragma once
// The CUDA backend: one GPU of one rank. Device memory comes from a stream-ordered pool
// (cudaMallocFromPoolAsync) that keeps freed memory reserved, so a steady-state step never
// calls cudaMalloc or cudaFree; every byte is charged to the ledger first, exactly as on the
// host backend. Work is ordered by four streams, one per role (compute, gather, reduce, host
// copies), and events between them; nothing blocks the host except synchronize(), wait_host()
// and grad_stats_of(), whose result the host needs.
//
// Host waits never block inside the driver (core/host_wait.hpp): they poll the stream or event
// and, between polls, run the checks registered in watch() (the engine registers its
// communicators' NCCL error and cancellation checks there) and the sync_timeout deadline. A copy
// to or from pageable host memory, which the driver would perform synchronously behind every
// queued kernel, first waits for its stream that way, so a hung collective ahead of it turns
// into an error instead of a hang. Teardown never waits: streams and the pool are released
// once their pending work drains (CUDA defers the release itself).
//
// Streams: make_stream() hands out the *compute* stream, so an engine with overlap off
// (engine_config::overlap) runs everything in one in-order queue, correct without any event.
// role_stream(role) gives the others; with overlap on (the default) the engine runs gathers and
// reductions there and orders them against compute with record()/wait() (state/stream_roles.hpp).
// Memory must be freed on a stream ordered after its last use (deallocate(..., stream)). Pointers handed out are device
// pointers: read them on the host through copy() and synchronize(), never directly.
//
// Launches kernels, so it is for CUDA translation units (.cu, compiled by nvcc). Link
// CUDA::cudart. The communicator that goes with it is comm/nccl_comm.hpp.
#if !defined(__CUDACC__)
#error "zshard/backend/cuda_backend.hpp launches kernels: include it from a .cu file compiled by nvcc"
#endif

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "zshard/backend/backend.hpp"
#include "zshard/backend/cuda_check.hpp"
#include "zshard/backend/cuda_kernels.cuh"
#include "zshard/backend/cuda_multi_tensor.cuh"
#include "zshard/backend/cuda_pinned.hpp"
#include "zshard/core/host_wait.hpp"

namespace zshard {

struct cuda_backend_options {
  int device = 0;
  std::optional<std::size_t> budget_bytes;       // device ledger: hard budget (I8)
  std::optional<std::size_t> host_budget_bytes;  // pinned host ledger
  std::string name = "cuda";
  // Freed bytes the pool keeps reserved instead of returning to the driver. The default keeps
  // all, which is what makes the steady state free of cudaMalloc/cudaFree.
  std::uint64_t pool_release_threshold = std::numeric_limits<std::uint64_t>::max();
  // Host waits (synchronize, wait_host, copies to pageable memory) poll and throw
  // error_kind::backend after this long, so a stream stuck behind a hung collective becomes an
  // error instead of a silent hang. 0: no deadline (the watch's checks still run).
  std::chrono::milliseconds sync_timeout{300'000};
};

class cuda_backend {
 public:
  using zshard_tag = backend_tag;
  static constexpr bool holds_storage = true;
  static constexpr bool memory_is_host = false;  // device memory: the host reads it through copy()

  // A non-owning handle on one of the backend's streams; cheap to copy.
  class stream {
   public:
    stream() = default;
    explicit stream(cudaStream_t h) noexcept : handle_(h) {}
    cudaStream_t handle() const noexcept { return handle_; }

   private:
    cudaStream_t handle_ = nullptr;
  };

  // An owning CUDA event (timing disabled: ordering only, the cheapest kind); move-only.
  class event {
   public:
    event() = default;
    explicit event(cudaEvent_t h) noexcept : handle_(h) {}
    event(event&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
    event& operator=(event&& o) noexcept {
      if (this != &o) {
        reset();
        handle_ = std::exchange(o.handle_, nullptr);
      }
      return *this;
    }
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    ~event() { reset(); }
    cudaEvent_t handle() const noexcept { return handle_; }

   private:
    void reset() noexcept {
      if (handle_) (void)cudaEventDestroy(handle_);  // safe while pending: released on completion
      handle_ = nullptr;
    }
    cudaEvent_t handle_ = nullptr;
  };

  explicit cuda_backend(cuda_backend_options opts = {})
      : opts_(std::move(opts)),
        ledger_(opts_.name + ":" + std::to_string(opts_.device), opts_.budget_bytes),
        pinned_(opts_.name + ":" + std::to_string(opts_.device) + ":pinned_host", opts_.host_budget_bytes) {
    cuda::check(cudaSetDevice(opts_.device), "cudaSetDevice(" + std::to_string(opts_.device) + ")");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = opts_.device;
    cuda::check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate(device " + std::to_string(opts_.device) + ")");
    std::uint64_t threshold = opts_.pool_release_threshold;
    try {
      cuda::check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
                  "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
      // Communication gets the higher priority: a gather that waits behind queued compute
      // delays the next module's compute by the whole gather.
      int least = 0, greatest = 0;
      ZSHARD_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      for (std::size_t r = 0; r < stream_role_count; ++r) {
        const auto role = static_cast<stream_role>(r);
        const bool comm = role == stream_role::gather || role == stream_role::reduce;
        cuda::check(cudaStreamCreateWithPriority(&streams_[r], cudaStreamNonBlocking, comm ? greatest : least),
                    "cudaStreamCreateWithPriority(" + std::string(to_string(role)) + ")");
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;
  // Every buffer must be gone before the backend. Pending work is not waited for: a stream stuck
  // behind a failed collective would hold teardown forever (CUDA releases streams and the pool
  // once their work drains; abort the communicator to make its kernels return).
  ~cuda_backend() { destroy(); }

  int device() const noexcept { return opts_.device; }
  const cuda_backend_options& options() const noexcept { return opts_; }
  memory_ledger& ledger() noexcept { return ledger_; }
  const memory_ledger& ledger() const noexcept { return ledger_; }
  // Pinned host memory (offloaded optimizer state, staging for host copies), with its own ledger.
  cuda_pinned_memory& pinned() noexcept { return pinned_; }
  cudaMemPool_t pool() const noexcept { return pool_; }
  // Checks every host wait of this backend runs between polls (see the header comment).
  wait_watch& watch() noexcept { return watch_; }
  const wait_watch& watch() const noexcept { return watch_; }

  // ---- memory ------------------------------------------------------------------------------
  // Without a stream: in the compute stream's order (see the header comment).
  void* allocate(std::size_t bytes, mem_category c) { return allocate(bytes, c, compute()); }
  // Allocates in the order of `s`: the memory is usable by work enqueued on s afterwards (other
  // streams must wait on an event recorded on s after this call).
  void* allocate(std::size_t bytes, mem_category c, const stream& s) {
    if (bytes == 0) return nullptr;
    rethrow_deferred();
    ledger_.charge(c, bytes);  // throws before anything is allocated
    void* p = nullptr;
    cudaError_t status = ensure_device_status();
    if (status == cudaSuccess) status = cudaMallocFromPoolAsync(&p, bytes, pool_, s.handle());
    if (status != cudaSuccess) {
      ledger_.release(c, bytes);
      (void)cudaGetLastError();
      throw cuda::make_error(status, "cudaMallocFromPoolAsync(" + std::to_string(bytes) + " bytes for " +
                                         std::string(to_string(c)) + " on device " + std::to_string(opts_.device) +
                                         ")");
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, mem_category c) noexcept { deallocate(p, bytes, c, compute()); }
  // Frees in the order of `s`: every use of p must be enqueued on s, or on a stream s waited for.
  // A failure cannot be thrown from here (buffers free in destructors): it is kept and thrown
  // by the next allocate(), synchronize() or grad_stats_of().
  void deallocate(void* p, std::size_t bytes, mem_category c, const stream& s) noexcept {
    if (!p) return;
    cudaError_t status = ensure_device_status();
    if (status == cudaSuccess) status = cudaFreeAsync(p, s.handle());
    if (status != cudaSuccess && deferred_.empty())
      deferred_ = "cudaFreeAsync(" + std::to_string(bytes) + " bytes of " + std::string(to_string(c)) +
                  ") failed: " + cuda::describe(status);
    ledger_.release(c, bytes);
  }

  // ---- streams and events ------------------------------------------------------------------
  stream make_stream() noexcept { return compute(); }
  stream role_stream(stream_role r) const noexcept { return stream(streams_[static_cast<std::size_t>(r)]); }
  event make_event() {
    ensure_device();
    cudaEvent_t e = nullptr;
    ZSHARD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return event(e);
  }
  // An event that can also time: for benchmarks and traces (elapsed_ms).
  event make_timing_event() {
    ensure_device();
    cudaEvent_t e = nullptr;
    ZSHARD_CUDA_CHECK(cudaEventCreate(&e));
    return event(e);
  }
  void record(event& e, const stream& s) {
    ensure_device();
    ZSHARD_CUDA_CHECK(cudaEventRecord(e.handle(), s.handle()));
  }
  void wait(const stream& s, const event& e) {
    ensure_device();
    ZSHARD_CUDA_CHECK(cudaStreamWaitEvent(s.handle(), e.handle(), 0));
  }
  // Has everything before the event's record completed? Never blocks.
  bool ready(const event& e) const {
    const cudaError_t status = cudaEventQuery(e.handle());
    if (status == cudaErrorNotReady) return false;
    ZSHARD_CUDA_CHECK(status);
    return true;
  }
  static float elapsed_ms(const event& from, const event& to) {
    float ms = 0;
    ZSHARD_CUDA_CHECK(cudaEventElapsedTime(&ms, from.handle(), to.handle()));
    return ms;
  }

  // Waits for s, polling (never cudaStreamSynchronize, which nothing can interrupt): the
  // watch's checks run between polls, and after options().sync_timeout it throws.
  void synchronize(const stream& s) {
    rethrow_deferred();
    const std::string what = "synchronize: stream on device " + std::to_string(opts_.device);
    poll_until([&] { return done(cudaStreamQuery(s.handle()), "cudaStreamQuery (synchronize)"); }, limits(), what,
               [&] { return timeout_error(what); });
  }
  // The host waits for everything before e's record, polling like synchronize().
  void wait_host(const event& e) {
    rethrow_deferred();
    const std::string what = "wait_host: event on device " + std::to_string(opts_.device);
    poll_until([&] { return done(cudaEventQuery(e.handle()), "cudaEventQuery (wait_host)"); }, limits(), what,
               [&] { return timeout_error(what); });
  }
  void synchronize_all() {
    for (std::size_t r = 0; r < stream_role_count; ++r) synchronize(stream(streams_[r]));
  }

  // ---- data movement -----------------------------------------------------------------------
  // Any direction (host<->device, device<->device). With pageable host memory on either side
  // the driver copies synchronously behind s's queued work, so s is first waited for by
  // polling (synchronize: watch, timeout); the copy has then completed (into pageable memory)
  // or been staged (from it) when this returns. Pinned host memory (pinned()) makes both truly
  // asynchronous: then wait for s (or an event after the copy) before reading.
  void copy(void* dst, const void* src, std::size_t bytes, const stream& s) {
    if (bytes == 0) return;
    ensure_device();
    if (pageable_host(dst) || pageable_host(src)) synchronize(s);
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.handle()),
                "cudaMemcpyAsync(" + std::to_string(bytes) + " bytes)");
  }
  void fill_zero(void* dst, std::size_t bytes, const stream& s) {
    if (bytes == 0) return;
    ensure_device();
    cuda::check(cudaMemsetAsync(dst, 0, bytes, s.handle()), "cudaMemsetAsync(" + std::to_string(bytes) + " bytes)");
  }
  // Zeroes every p[i][0, bytes[i]) in one launch per two dozen (backend.hpp's batched_fill_zero).
  void fill_zero_batch(std::span<void* const> p, std::span<const std::size_t> bytes, const stream& s) {
    ZSHARD_REQUIRE(p.size() == bytes.size(), error_kind::usage,
                   "fill_zero_batch: " + std::to_string(p.size()) + " buffers, " + std::to_string(bytes.size()) + " sizes");
    if (p.empty()) return;
    ensure_device();
    launched(cuda::zero_batch(p, bytes, s.handle()), "fill_zero (" + std::to_string(p.size()) + " buffers)", p.size());
  }
  void fill(void* dst, dtype t, std::size_t n, float value, const stream& s) {
    ensure_device();
    launched(cuda::fill(dst, t, n, value, s.handle()), "fill", n);
  }
  void convert(const void* src, dtype src_type, void* dst, dtype dst_type, std::size_t n, const stream& s) {
    ensure_device();
    launched(cuda::cast(src, src_type, dst, dst_type, n, s.handle()),
             "cast " + std::string(to_string(src_type)) + "->" + std::string(to_string(dst_type)), n);
  }

  // ---- kernels (launched on the backend's device whatever the calling thread's current one) --
  void add_into(float* dst, const float* src, std::size_t n, const stream& s) {
    ensure_device();
    launched(cuda::add_into(dst, src, n, s.handle()), "add_into", n);
  }
  void adamw(const optim::adamw_step& step, float* master, float* m, float* v, const float* grad, std::size_t n,
             void* working_out, dtype working_type, const stream& s) {
    ensure_device();
    launched(cuda::adamw(step, master, m, v, grad, n, working_out, working_type, s.handle()), "adamw", n);
  }
  // x *= scale; *nonfinite_flag (device) set to 1 on Inf/NaN. Asynchronous.
  void scale_and_check(float* x, std::size_t n, float scale, unsigned* nonfinite_flag, const stream& s) {
    ensure_device();
    launched(cuda::scale_and_check(x, n, scale, nonfinite_flag, s.handle()), "scale_and_check", n);
  }

  // Synchronous, as on every backend: the host needs the result for a global decision.
  grad_stats grad_stats_of(const float* g, std::size_t n, const stream& s) {
    if (n == 0) return {};
    const std::size_t partials = cuda::sum_squares_partials(std::span<const std::size_t>(&n, 1));
    void* block = allocate((1 + partials) * sizeof(double), mem_category::scratch, s);  // [result | partials]
    double sum = 0;
    try {
      launched(cuda::sum_squares_batch(std::span<const float* const>(&g, 1), std::span<const std::size_t>(&n, 1),
                                       static_cast<double*>(block), static_cast<double*>(block) + 1, s.handle()),
               "sum_squares", n);
      copy(&sum, block, sizeof sum, s);
    } catch (...) {
      deallocate(block, (1 + partials) * sizeof(double), mem_category::scratch, s);
      throw;
    }
    deallocate(block, (1 + partials) * sizeof(double), mem_category::scratch, s);
    synchronize(s);
    return {sum, !std::isfinite(sum)};
  }
  // Enqueues *device_out = sum of g[i]^2 (double, device memory) without waiting: a caller
  // with many tensors reduces each into its own slot and reads them all with one copy and one
  // synchronize, instead of one host wait per tensor (grad_stats_of). Non-finite: Inf/NaN.
  void sum_squares_into(const float* g, std::size_t n, double* device_out, const stream& s) {
    if (n == 0) return fill_zero(device_out, sizeof(double), s);
    sum_squares_batch(std::span<const float* const>(&g, 1), std::span<const std::size_t>(&n, 1), device_out, s);
  }
  // device_out[i] = sum of squares of x[i][0, n[i]) for every i (double, device memory), in a
  // launch or two per 24 tensors and one scratch block, without waiting (backend.hpp's
  // batched_sum_squares). The same arithmetic as sum_squares_into and grad_stats_of, bit for bit.
  void sum_squares_batch(std::span<const float* const> x, std::span<const std::size_t> n, double* device_out,
                         const stream& s) {
    ZSHARD_REQUIRE(x.size() == n.size(), error_kind::usage,
                   "sum_squares_batch: " + std::to_string(x.size()) + " tensors, " + std::to_string(n.size()) + " sizes");
    if (x.empty()) return;
    ensure_device();
    const std::size_t bytes = cuda::sum_squares_partials(n) * sizeof(double);
    void* partial = allocate(bytes, mem_category::scratch, s);
    const cudaError_t status = cuda::sum_squares_batch(x, n, device_out, static_cast<double*>(partial), s.handle());
    deallocate(partial, bytes, mem_category::scratch, s);
    launched(status, "sum_squares (" + std::to_string(x.size()) + " tensors)", x.size());
  }
  // Every task as adamw() applies it, in as few launches as the working types allow; with
  // zero_grad each gradient read is zeroed in the same pass (backend.hpp's batched_adamw).
  void adamw_batch(std::span<const adamw_task> tasks, bool zero_grad, const stream& s) {
    ensure_device();
    launched(cuda::adamw_batch(tasks, zero_grad, s.handle()), "adamw (" + std::to_string(tasks.size()) + " tensors)",
             tasks.size());
  }
  // max |g[i]|, synchronous (NaN when any element is NaN).
  float max_abs_of(const float* g, std::size_t n, const stream& s) {
    if (n == 0) return 0.0f;
    float amax = 0;
    const auto r = reduce_into_device<float>(g, n, s, "max_abs", [](void* t, std::size_t& tb, const float* x,
                                                                     std::size_t k, float* o, cudaStream_t st) {
      return cuda::max_abs(t, tb, x, k, o, st);
    });
    copy(&amax, r.result(), sizeof amax, s);
    deallocate(r.block, r.bytes, mem_category::scratch, s);
    synchronize(s);
    return amax;
  }

 private:
  stream compute() const noexcept { return stream(streams_[0]); }

  cudaError_t ensure_device_status() const noexcept {
    int current = -1;
    const cudaError_t status = cudaGetDevice(&current);
    if (status != cudaSuccess || current == opts_.device) return status;
    return cudaSetDevice(opts_.device);
  }
  void ensure_device() const { cuda::ensure_device(opts_.device); }

  wait_limits limits() const noexcept { return {opts_.sync_timeout, &watch_, nullptr}; }
  // A query's answer: finished (true), not yet (false), or a device error (throws).
  static bool done(cudaError_t status, const char* call) {
    if (status == cudaErrorNotReady) return false;
    cuda::check(status, call);
    return true;
  }
  error timeout_error(const std::string& what) const {
    return error(error_kind::backend, what + " did not finish within " + std::to_string(opts_.sync_timeout.count()) + " ms",
                 "a collective on this stream may be waiting for a rank that failed or skipped it; raise "
                 "cuda_backend_options::sync_timeout if the queued work is legitimately that long");
  }
  // Host memory the driver does not know (malloc, the stack): copies with it are synchronous.
  static bool pageable_host(const void* p) noexcept {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return true;
    }
    return a.type == cudaMemoryTypeUnregistered;
  }

  void launched(cudaError_t status, const std::string& what, std::size_t n) const {
    if (status != cudaSuccess)
      throw cuda::make_error(status, what + " kernel launch (" + std::to_string(n) + " elements, device " +
                                         std::to_string(opts_.device) + ")");
  }

  void rethrow_deferred() {
    if (deferred_.empty()) return;
    std::string msg = std::exchange(deferred_, {});
    throw error(error_kind::backend, msg + " (reported late: it failed while a buffer was being freed)");
  }

  template <class T>
  struct reduce_scratch {
    void* block;
    std::size_t bytes;
    T* result() const noexcept { return static_cast<T*>(block); }
  };
  static constexpr std::size_t reduce_header = 256;  // the result; keeps CUB's temp 256-byte aligned

  // A CUB two-phase reduction of n f32 into one T on the device, enqueued on s. Its result and
  // temp storage share one ledgered scratch block from the pool, [result | temp], which the
  // caller frees in the order of s once it has copied the result out.
  template <class T, class Reduce>
  reduce_scratch<T> reduce_into_device(const float* x, std::size_t n, const stream& s, const char* what,
                                       Reduce&& reduce) {
    ensure_device();
    std::size_t temp_bytes = 0;
    cuda::check(reduce(nullptr, temp_bytes, x, n, static_cast<T*>(nullptr), s.handle()),
                std::string("cub ") + what + " (temp storage query)");
    reduce_scratch<T> r{nullptr, reduce_header + temp_bytes};
    r.block = allocate(r.bytes, mem_category::scratch, s);
    const cudaError_t status =
        reduce(static_cast<unsigned char*>(r.block) + reduce_header, temp_bytes, x, n, r.result(), s.handle());
    if (status != cudaSuccess) {
      deallocate(r.block, r.bytes, mem_category::scratch, s);
      throw cuda::make_error(status, std::string("cub ") + what + " (" + std::to_string(n) + " elements)");
    }
    return r;
  }

  // Never waits: cudaStreamDestroy and cudaMemPoolDestroy return at once and release their
  // resources when pending work (a collective that an abort will end) has drained.
  void destroy() noexcept {
    (void)ensure_device_status();
    for (cudaStream_t& st : streams_) {
      if (st) (void)cudaStreamDestroy(st);
      st = nullptr;
    }
    if (pool_) (void)cudaMemPoolDestroy(pool_);  // outstanding blocks (a leak) are released when freed
    pool_ = nullptr;
  }

  cuda_backend_options opts_;
  memory_ledger ledger_;
  cuda_pinned_memory pinned_;
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t streams_[stream_role_count] = {};
  std::string deferred_;
  wait_watch watch_;
};

static_assert(check_backend<cuda_backend>());

}  // namespace zshard

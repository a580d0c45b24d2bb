// GPU tests, in one translation unit because nvcc is slow: the kernels against the host
// reference (bit for bit), the CUDA backend's contract (ledger, copies, streams, events,
// timeouts), the NCCL communicator against serial references, and the engine on cuda_backend
// + nccl_comm against the float64 single-process reference (I7).
//
// Without a GPU only the host-side cases (suite "host_side") run; the program then prints
// "skipped: no CUDA device (...)" and exits with 77, which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <random>

#include "gpu_support.hpp"

using zshard::dtype;
using zshard::mem_category;
namespace zcuda = zshard::cuda;
using zshard::nccl_comm;

namespace {

std::vector<float> special_floats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 6e-8f, 3e-8f, 2.98e-8f,
                          5.9604645e-8f, 6.1035156e-5f, 6.09e-5f, 1e30f, -1e-30f, 3.4e38f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc12345u)};
  for (std::uint32_t m : {0x8000u, 0x18000u, 0x7fffu, 0x1000u, 0x3000u, 0x2000u})  // bf16 and f16 ties
    for (std::uint32_t e : {0x3f800000u, 0x47000000u, 0x38800000u, 0x33800000u})
      v.push_back(std::bit_cast<float>(e | m));
  std::mt19937 rng(7);
  for (int i = 0; i < 100'000; ++i) v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  return v;
}

template <class T>
std::vector<T> all_16bit_patterns() {
  std::vector<T> v(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) v[i] = T{static_cast<std::uint16_t>(i)};
  return v;
}

template <class T>
std::vector<std::uint32_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint32_t> out;
  for (const T& x : v) {
    if constexpr (std::is_same_v<T, float>) out.push_back(std::bit_cast<std::uint32_t>(x));
    else out.push_back(x.bits);
  }
  return out;
}

// Casts src (on the device, aligned for vector loads or not) to D and compares bits with the host.
template <class S, class D>
void check_cast(zshard::cuda_backend& b, const std::vector<S>& src, std::size_t offset) {
  INFO(zshard::to_string(zshard::dtype_of<S>) << " -> " << zshard::to_string(zshard::dtype_of<D>) << ", offset "
                                               << offset);
  gpu_test::device_array<S> in(b, src, offset);
  gpu_test::device_array<D> out(b, std::vector<D>(src.size()), offset);
  b.convert(in.ptr, zshard::dtype_of<S>, out.ptr, zshard::dtype_of<D>, src.size(), b.make_stream());
  std::vector<D> want(src.size());
  zshard::convert(src.data(), zshard::dtype_of<S>, want.data(), zshard::dtype_of<D>, src.size());
  const auto got_bits = bits_of(out.to_host(b)), want_bits = bits_of(want);
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < src.size(); ++i)
    if (got_bits[i] != want_bits[i] && mismatches++ == 0) first = i;
  INFO("first mismatch at " << first << ": got 0x" << std::hex << got_bits[first] << ", want 0x" << want_bits[first]);
  CHECK(mismatches == 0);
}

std::vector<float> random_floats(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A kernel that keeps its stream busy for about `ns` nanoseconds.
__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = clock64();
  const unsigned long long cycles = ns * 2;  // >= 1 cycle per ns on any current GPU: at least ns
  while (clock64() - start < cycles) {
  }
}

}  // namespace

// ---- host side: runs everywhere -------------------------------------------------------------
TEST_SUITE("host_side") {
  TEST_CASE("a failed CUDA call becomes a backend error naming the call and CUDA's description") {
    try {
      zcuda::check(cudaErrorMemoryAllocation, "cudaMallocFromPoolAsync(1024 bytes for scratch)");
      FAIL("no throw");
    } catch (const zshard::error& e) {
      CHECK(e.kind() == zshard::error_kind::backend);
      const std::string what = e.what();
      CHECK(what.find("cudaMallocFromPoolAsync(1024 bytes for scratch) failed: cudaErrorMemoryAllocation") !=
            std::string::npos);
      CHECK(!e.hint().empty());
    }
    CHECK_NOTHROW(ZSHARD_CUDA_CHECK(cudaSuccess));
  }

  // The kernels' element functions compile for the host too: hold their transcription of the
  // reference to it here, where there is no GPU; the device cases below repeat it on the GPU.
  TEST_CASE("the kernels' element conversions are core/dtype.hpp's, on the host") {
    for (float f : special_floats()) {
      REQUIRE(zcuda::kernels::from_f32<zshard::bf16>(f).bits == zshard::to_bf16(f).bits);
      REQUIRE(zcuda::kernels::from_f32<zshard::f16>(f).bits == zshard::to_f16(f).bits);
    }
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const auto h = static_cast<std::uint16_t>(i);
      REQUIRE(std::bit_cast<std::uint32_t>(zcuda::kernels::to_f32(zshard::bf16{h})) ==
              std::bit_cast<std::uint32_t>(zshard::to_float(zshard::bf16{h})));
      REQUIRE(std::bit_cast<std::uint32_t>(zcuda::kernels::to_f32(zshard::f16{h})) ==
              std::bit_cast<std::uint32_t>(zshard::to_float(zshard::f16{h})));
    }
  }

  TEST_CASE("the AdamW kernel's element update is adamw_update_scalar's, on the host") {
    const std::size_t n = 10'000;
    auto master = random_floats(n, -1, 1, 1), m = random_floats(n, -0.1f, 0.1f, 2), v = random_floats(n, 0, 0.01f, 3);
    const auto grad = random_floats(n, -2, 2, 4);
    auto m2 = master, m_2 = m, v2 = v;
    const auto step = zshard::optim::make_adamw_step({.lr = 1e-2f, .weight_decay = 0.1f}, 3, 0.7f, true);
    std::vector<zshard::bf16> want(n);
    zshard::optim::adamw_update_scalar(step, master.data(), m.data(), v.data(), grad.data(), n, want.data(),
                                       dtype::bf16);
    const auto k = zcuda::kernels::make_adamw_scalars(step);
    for (std::size_t i = 0; i < n; ++i) {
      const float p = zcuda::kernels::adamw_element(k, m2[i], m_2[i], v2[i], grad[i]);
      REQUIRE(zcuda::kernels::from_f32<zshard::bf16>(p).bits == want[i].bits);
    }
    CHECK(bits_of(m2) == bits_of(master));
    CHECK(bits_of(m_2) == bits_of(m));
    CHECK(bits_of(v2) == bits_of(v));
  }

  TEST_CASE("the AdamW kernel's per-step scalars are the reference's expressions") {
    const auto s = zshard::optim::make_adamw_step({.lr = 3e-3f, .weight_decay = 0.1f}, 5, 0.5f, true);
    const auto k = zcuda::kernels::make_adamw_scalars(s);
    CHECK(k.decay == 1.0f - s.lr * s.weight_decay);
    CHECK(k.step_size == s.lr / s.bias_correction1);
    CHECK(k.sqrt_bc2 == std::sqrt(s.bias_correction2));
  }
}

// ---- kernels vs the host reference ------------------------------------------------------------
TEST_CASE("casts between f32, bf16 and f16 match core/dtype.hpp bit for bit (NaN payloads, subnormals, ties)") {
  zshard::cuda_backend b;
  auto f = special_floats();
  f.push_back(1.0f);  // a length that is not a multiple of 4: the vector path's scalar tail
  const auto bf = all_16bit_patterns<zshard::bf16>();
  const auto hf = all_16bit_patterns<zshard::f16>();
  for (std::size_t offset : {0, 1}) {  // 0: four elements per vector load and store; 1: the scalar path
    check_cast<float, zshard::bf16>(b, f, offset);
    check_cast<float, zshard::f16>(b, f, offset);
    check_cast<zshard::bf16, float>(b, bf, offset);
    check_cast<zshard::f16, float>(b, hf, offset);
    check_cast<zshard::bf16, zshard::f16>(b, bf, offset);
    check_cast<zshard::f16, zshard::bf16>(b, hf, offset);
    check_cast<float, float>(b, f, offset);
  }
  CHECK(b.ledger().total_current() == 0);
}

TEST_CASE("fused AdamW matches optim::adamw_update_scalar bit for bit, for every working dtype and alignment") {
  zshard::cuda_backend b;
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{1031}, std::size_t{200'003}}) {
    for (std::size_t offset : {0, 1}) {
      for (int w = -1; w < 3; ++w) {  // -1: no working copy
        INFO("n " << n << ", offset " << offset << ", working " << w);
        auto master = random_floats(n, -1, 1, 1), m = random_floats(n, -0.1f, 0.1f, 2);
        auto v = random_floats(n, 0, 0.01f, 3);
        const auto grad = random_floats(n, -2, 2, 4);
        const auto step = zshard::optim::make_adamw_step({.lr = 1e-2f, .weight_decay = 0.1f}, 3, 0.7f, true);
        gpu_test::device_array<float> dm(b, master, offset), d1(b, m, offset), d2(b, v, offset), dg(b, grad, offset);
        const dtype wt = w < 0 ? dtype::f32 : static_cast<dtype>(w);
        // offset 1 float: 4-byte aligned, so 16-bit working copies take the scalar path too
        gpu_test::device_array<float> dout(b, std::vector<float>(n), offset);
        b.adamw(step, dm.ptr, d1.ptr, d2.ptr, dg.ptr, n, w < 0 ? nullptr : dout.ptr, wt, b.make_stream());
        std::vector<float> want_out(n);
        zshard::optim::adamw_update_scalar(step, master.data(), m.data(), v.data(), grad.data(), n,
                                           w < 0 ? nullptr : want_out.data(), wt);
        CHECK(bits_of(dm.to_host(b)) == bits_of(master));
        CHECK(bits_of(d1.to_host(b)) == bits_of(m));
        CHECK(bits_of(d2.to_host(b)) == bits_of(v));
        if (w >= 0) CHECK(std::memcmp(dout.to_host(b).data(), want_out.data(), n * zshard::size_of(wt)) == 0);
      }
    }
  }
  // working_out may alias master when the working dtype is f32
  auto master = random_floats(999, -1, 1, 5), m = random_floats(999, 0, 0, 6), v = m;
  const auto grad = random_floats(999, -1, 1, 7);
  const auto step = zshard::optim::make_adamw_step({}, 1, 1.0f, false);
  gpu_test::device_array<float> dm(b, master), d1(b, m), d2(b, v), dg(b, grad);
  b.adamw(step, dm.ptr, d1.ptr, d2.ptr, dg.ptr, 999, dm.ptr, dtype::f32, b.make_stream());
  zshard::optim::adamw_update_scalar(step, master.data(), m.data(), v.data(), grad.data(), 999, master.data(),
                                     dtype::f32);
  CHECK(bits_of(dm.to_host(b)) == bits_of(master));
}

TEST_CASE("add_into, fill, scale_and_check, sum of squares and max |x| against the host") {
  zshard::cuda_backend b;
  auto s = b.make_stream();
  for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{4096}, std::size_t{1'000'001}}) {
    INFO("n " << n);
    auto x = random_floats(n, -3, 3, 11);
    const auto y = random_floats(n, -1, 1, 12);
    gpu_test::device_array<float> dx(b, x, n % 2), dy(b, y);
    b.add_into(dx.ptr, dy.ptr, n, s);
    for (std::size_t i = 0; i < n; ++i) x[i] += y[i];
    CHECK(dx.to_host(b) == x);

    zshard::optim::norm_accumulator acc;
    acc.add(x.data(), n, 1.0f);
    const auto st = b.grad_stats_of(dx.ptr, n, s);
    CHECK(st.sum_squares == doctest::Approx(acc.sum_squares).epsilon(1e-12));
    CHECK_FALSE(st.nonfinite);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::abs(v));
    CHECK(b.max_abs_of(dx.ptr, n, s) == amax);
    // batched: two tensors into two device slots, one read
    gpu_test::device_array<double> slots(b, std::vector<double>(2));
    b.sum_squares_into(dx.ptr, n, slots.ptr, s);
    b.sum_squares_into(dy.ptr, n, slots.ptr + 1, s);
    zshard::optim::norm_accumulator acc_y;
    acc_y.add(y.data(), n, 1.0f);
    const auto both = slots.to_host(b);
    CHECK(both[0] == st.sum_squares);  // the same reduction, bit for bit
    CHECK(both[1] == doctest::Approx(acc_y.sum_squares).epsilon(1e-12));

    gpu_test::device_array<unsigned> flag(b, std::vector<unsigned>{0});
    b.scale_and_check(dx.ptr, n, 0.25f, flag.ptr, s);
    for (float& v : x) v *= 0.25f;
    CHECK(dx.to_host(b) == x);
    CHECK(flag.to_host(b)[0] == 0u);

    const float bad = n % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    b.copy(dx.ptr + n / 2, &bad, sizeof bad, s);
    CHECK(b.grad_stats_of(dx.ptr, n, s).nonfinite);
    b.scale_and_check(dx.ptr, n, 1.0f, flag.ptr, s);
    CHECK(flag.to_host(b)[0] == 1u);

    for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
      b.fill(dx.ptr, t, n, 1.5f, s);
      std::vector<float> back(n);
      gpu_test::device_array<float> wide(b, back);
      b.convert(dx.ptr, t, wide.ptr, dtype::f32, n, s);
      CHECK(wide.to_host(b) == std::vector<float>(n, 1.5f));
    }
  }
  CHECK(b.ledger().total_current() == 0);
  CHECK(b.ledger().peak(mem_category::scratch) > 0);  // CUB's temp storage went through the ledger
}

TEST_CASE("batched AdamW and sums of squares equal the single-tensor kernels bit for bit, across launches") {
  zshard::cuda_backend b;
  auto s = b.make_stream();
  struct tensor {
    std::vector<float> master, m, v, grad;
    std::size_t offset;
    int working;  // -1: none, else a dtype
  };
  std::vector<tensor> ts;
  const std::size_t sizes[] = {1, 3, 4, 5, 1031, 4096, 200'003};
  for (int i = 0; i < 30; ++i) {  // more than one launch's worth (multi_tensor_max)
    const std::size_t n = sizes[std::size_t(i) % 7];
    const auto seed = unsigned(100 + 4 * i);
    ts.push_back({random_floats(n, -1, 1, seed), random_floats(n, -0.1f, 0.1f, seed + 1), random_floats(n, 0, 0.01f, seed + 2),
                  random_floats(n, -2, 2, seed + 3), std::size_t(i % 3 == 0), (i / 3) % 4 - 1});
  }
  const auto step = zshard::optim::make_adamw_step({.lr = 1e-2f, .weight_decay = 0.1f}, 3, 0.7f, true);
  using arr = gpu_test::device_array<float>;
  std::vector<arr> a_master, a_m, a_v, a_grad, a_out, r_master, r_m, r_v, r_out;
  std::vector<zshard::adamw_task> tasks;
  for (const auto& t : ts) {
    a_master.emplace_back(b, t.master, t.offset), a_m.emplace_back(b, t.m, t.offset), a_v.emplace_back(b, t.v, t.offset);
    a_grad.emplace_back(b, t.grad, t.offset), a_out.emplace_back(b, std::vector<float>(t.master.size()), t.offset);
    r_master.emplace_back(b, t.master, t.offset), r_m.emplace_back(b, t.m, t.offset), r_v.emplace_back(b, t.v, t.offset);
    r_out.emplace_back(b, std::vector<float>(t.master.size()), t.offset);
  }
  std::vector<const float*> ptrs;
  std::vector<std::size_t> counts;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const dtype wt = ts[i].working < 0 ? dtype::f32 : dtype(ts[i].working);
    void* out = ts[i].working < 0 ? nullptr : a_out[i].ptr;
    tasks.push_back({step, a_master[i].ptr, a_m[i].ptr, a_v[i].ptr, a_grad[i].ptr, ts[i].master.size(), out, wt});
    b.adamw(step, r_master[i].ptr, r_m[i].ptr, r_v[i].ptr, a_grad[i].ptr, ts[i].master.size(),
            ts[i].working < 0 ? nullptr : r_out[i].ptr, wt, s);
    ptrs.push_back(a_grad[i].ptr);
    counts.push_back(ts[i].grad.size());
  }
  gpu_test::device_array<double> sums(b, std::vector<double>(ts.size())), one(b, std::vector<double>(ts.size()));
  b.sum_squares_batch(ptrs, counts, sums.ptr, s);
  for (std::size_t i = 0; i < ts.size(); ++i) b.sum_squares_into(ptrs[i], counts[i], one.ptr + i, s);
  b.adamw_batch(tasks, /*zero_grad=*/true, s);
  CHECK(sums.to_host(b) == one.to_host(b));
  for (std::size_t i = 0; i < ts.size(); ++i) {
    INFO("tensor " << i << ", n " << ts[i].master.size() << ", offset " << ts[i].offset << ", working " << ts[i].working);
    zshard::optim::norm_accumulator acc;
    acc.add(ts[i].grad.data(), ts[i].grad.size(), 1.0f);
    CHECK(sums.to_host(b)[i] == doctest::Approx(acc.sum_squares).epsilon(1e-12));
    CHECK(bits_of(a_master[i].to_host(b)) == bits_of(r_master[i].to_host(b)));
    CHECK(bits_of(a_m[i].to_host(b)) == bits_of(r_m[i].to_host(b)));
    CHECK(bits_of(a_v[i].to_host(b)) == bits_of(r_v[i].to_host(b)));
    if (ts[i].working >= 0) {
      const std::size_t bytes = ts[i].master.size() * zshard::size_of(dtype(ts[i].working));
      CHECK(std::memcmp(a_out[i].to_host(b).data(), r_out[i].to_host(b).data(), bytes) == 0);
    }
    CHECK(a_grad[i].to_host(b) == std::vector<float>(ts[i].grad.size(), 0.0f));  // zeroed in the same pass
  }
}

TEST_CASE("fill_zero_batch zeroes exactly each range, aligned or not, across launches") {
  zshard::cuda_backend b;
  auto s = b.make_stream();
  using arr = gpu_test::device_array<unsigned char>;
  const std::size_t sizes[] = {0, 1, 15, 16, 17, 4096 + 3, 1'000'003};
  std::vector<arr> bufs;
  std::vector<void*> at;
  std::vector<std::size_t> bytes;
  for (int i = 0; i < 30; ++i) {  // more than one launch's worth (multi_tensor_max)
    const std::size_t n = sizes[std::size_t(i) % 7], offset = std::size_t(i % 3);  // 16-byte aligned or not
    bufs.emplace_back(b, std::vector<unsigned char>(n + 8, 0xab), offset);
    at.push_back(bufs.back().ptr + 4);  // 4 sentinel bytes on either side
    bytes.push_back(n);
  }
  b.fill_zero_batch(at, bytes, s);
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    INFO("buffer " << i << ", " << bytes[i] << " bytes");
    const auto h = bufs[i].to_host(b);
    for (std::size_t k = 0; k < h.size(); ++k) REQUIRE(int(h[k]) == (k >= 4 && k < 4 + bytes[i] ? 0 : 0xab));
  }
}

// ---- the backend's contract ---------------------------------------------------------------------
TEST_CASE("cuda_backend: the ledger is charged before allocating and released after freeing, as on the host") {
  zshard::cuda_backend b({.budget_bytes = 1 << 20});
  CHECK(b.allocate(0, mem_category::scratch) == nullptr);
  void* p = b.allocate(1000, mem_category::gathered_params);
  CHECK(p != nullptr);
  CHECK(b.ledger().current(mem_category::gathered_params) == 1000);
  try {
    (void)b.allocate(1 << 20, mem_category::grad_buckets);
    FAIL("no budget error");
  } catch (const zshard::error& e) {
    CHECK(e.kind() == zshard::error_kind::budget);
    CHECK(std::string(e.what()).find("grad_buckets") != std::string::npos);
  }
  CHECK(b.ledger().total_current() == 1000);  // the refused request changed nothing
  b.deallocate(p, 1000, mem_category::gathered_params);
  CHECK(b.ledger().total_current() == 0);
  CHECK(b.ledger().peak(mem_category::gathered_params) == 1000);

  zshard::buffer<zshard::cuda_pinned_memory> pinned(b.pinned(), dtype::f32, 256, mem_category::optimizer_state);
  CHECK(b.pinned().ledger().current(mem_category::optimizer_state) == 1024);
  cudaPointerAttributes attr{};
  ZSHARD_CUDA_CHECK(cudaPointerGetAttributes(&attr, pinned.data()));
  CHECK(attr.type == cudaMemoryTypeHost);
}

TEST_CASE("cuda_backend: copies in every direction, and events order work across the role streams") {
  zshard::cuda_backend b;
  const std::size_t n = 1 << 22;
  const auto host = random_floats(n, -1, 1, 21);
  zshard::buffer<zshard::cuda_backend> a(b, dtype::f32, n, mem_category::scratch),
      c(b, dtype::f32, n, mem_category::scratch);
  zshard::buffer<zshard::cuda_pinned_memory> staging(b.pinned(), dtype::f32, n, mem_category::scratch);
  const auto gather = b.role_stream(zshard::stream_role::gather);
  const auto compute = b.make_stream();
  const auto copies = b.role_stream(zshard::stream_role::host_copy);
  auto ev = b.make_event(), ev2 = b.make_event();
  b.record(ev, compute);  // a's allocation (compute order) before the gather stream touches it
  b.wait(gather, ev);
  spin_kernel<<<1, 1, 0, gather.handle()>>>(2'000'000);  // makes a race visible if the wait were missing
  b.copy(a.data(), host.data(), n * 4, gather);           // host -> device (pageable, staged)
  b.record(ev, gather);
  b.wait(compute, ev);
  b.copy(c.data(), a.data(), n * 4, compute);  // device -> device, after the gather stream's write
  b.record(ev2, compute);
  b.wait(copies, ev2);
  b.copy(staging.data(), c.data(), n * 4, copies);  // device -> pinned host, truly asynchronous
  b.synchronize(copies);
  CHECK(b.ready(ev2));
  CHECK(std::memcmp(staging.data(), host.data(), n * 4) == 0);
  b.synchronize_all();
}

TEST_CASE("cuda_backend: synchronize() turns a stream that does not finish into an error, not a hang") {
  zshard::cuda_backend b({.sync_timeout = std::chrono::milliseconds(200)});
  auto s = b.make_stream();
  spin_kernel<<<1, 1, 0, s.handle()>>>(2'000'000'000ull);  // ~2 s
  try {
    b.synchronize(s);
    FAIL("no timeout");
  } catch (const zshard::error& e) {
    CHECK(e.kind() == zshard::error_kind::backend);
    CHECK(std::string(e.what()).find("did not finish within 200 ms") != std::string::npos);
  }
  ZSHARD_CUDA_CHECK(cudaStreamSynchronize(s.handle()));
}

#include "nccl_cases.hpp"
#include "engine_cases.hpp"
#include "readiness_cases.hpp"
#include "gpt_cases.hpp"

int main(int argc, char** argv) {
  const auto census = zcuda::count_devices();
  doctest::Context ctx(argc, argv);
  if (census.count == 0) {
    ctx.addFilter("test-suite", "host_side");
    const int rc = ctx.run();
    if (rc != 0 || ctx.shouldExit()) return rc;
    std::printf("skipped: no CUDA device (%s); the GPU tests need one\n", census.reason.c_str());
    return 77;  // ctest: SKIP_RETURN_CODE
  }
  cudaDeviceProp prop{};
  ZSHARD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU tests on %d device(s); device 0: %s (sm_%d%d)\n", census.count, prop.name, prop.major, prop.minor);
  return ctx.run();
}

// NCCL with one process per GPU, bootstrapped over MPI (comm/nccl_mpi.hpp), run as
// `mpiexec -n <GPUs> test_nccl_mpi`: every process makes its nccl_comm from an mpi_comm
// (rank 0's id broadcast over MPI, GPU from the node-local rank), then all_reduce, reduce_scatter
// and all_gather on the device agree with the MPI communicator on the host (sums: within
// rounding, NCCL's order is its own; gathers: exactly), and split sub-groups do the same.
// Plain C++ (nccl_comm.hpp needs only the runtime API). Exits 77 (ctest: skipped) without a GPU.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "zshard/comm/mpi_run.hpp"
#include "zshard/comm/nccl_mpi.hpp"

namespace {

int failures = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "test_nccl_mpi: rank %d: FAILED: %s\n", rank, what.c_str());
  }
}

std::vector<float> on_host(const float* d, std::size_t n) {
  std::vector<float> h(n);
  zshard::cuda::check(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

// all_reduce and all_gather of `n` floats on `nccl`, checked against `host` (same group).
void check_group(zshard::nccl_comm& nccl, zshard::mpi_comm& host, std::size_t n, const std::string& what) {
  const int r = host.rank(), w = host.size();
  std::vector<float> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = std::sin(float(i) * 0.37f + float(r)) * float(1 + r);
  float *d_in = nullptr, *d_out = nullptr;
  zshard::cuda::check(cudaMalloc(&d_in, n * sizeof(float)), "cudaMalloc");
  zshard::cuda::check(cudaMalloc(&d_out, n * w * sizeof(float)), "cudaMalloc");
  zshard::cuda::check(cudaMemcpy(d_in, mine.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  nccl.all_reduce(d_in, d_out, n, zshard::dtype::f32, zshard::reduce_op::sum);
  std::vector<float> want(n);
  host.all_reduce(mine.data(), want.data(), n, zshard::dtype::f32, zshard::reduce_op::sum);
  const auto got = on_host(d_out, n);
  bool close = true;
  for (std::size_t i = 0; i < n; ++i)
    close = close && std::fabs(got[i] - want[i]) <= 1e-5f * (1 + std::fabs(want[i])) * w;
  expect(close, what + ": all_reduce vs mpi_comm", r);
  nccl.all_gather(d_in, d_out, n, zshard::dtype::f32);
  std::vector<float> gathered(n * w);
  host.all_gather(mine.data(), gathered.data(), n, zshard::dtype::f32);
  expect(on_host(d_out, n * w) == gathered, what + ": all_gather vs mpi_comm", r);
  cudaFree(d_in);
  cudaFree(d_out);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("test_nccl_mpi: no GPU, skipped\n");
    return 77;
  }
  return zshard::run_mpi(argc, argv, [&](zshard::mpi_comm& host) {
    zshard::nccl_comm nccl = zshard::make_nccl_comm(host);
    expect(nccl.rank() == host.rank() && nccl.size() == host.size(), "ranks match MPI's", host.rank());
    expect(nccl.device() == zshard::node_local_rank(host.handle()).rank, "GPU = node-local rank", host.rank());
    check_group(nccl, host, 1001, "world");
    zshard::nccl_comm nsub = nccl.split(host.rank() % 2, -host.rank());
    zshard::mpi_comm hsub = host.split(host.rank() % 2, -host.rank());
    expect(nsub.rank() == hsub.rank() && nsub.size() == hsub.size(), "split ranks match MPI's", host.rank());
    check_group(nsub, hsub, 777, "split by parity");
    float all_failures = float(failures);
    host.all_reduce(&all_failures, &all_failures, 1, zshard::dtype::f32, zshard::reduce_op::max);
    if (host.rank() == 0)
      std::printf("test_nccl_mpi: %d process(es), %s\n", host.size(), all_failures > 0 ? "FAILED" : "passed");
    if (all_failures > 0) throw std::runtime_error("test_nccl_mpi failed (see the FAILED lines above)");
  });
}

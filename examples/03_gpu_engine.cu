// 03_gpu_engine: the ZeRO-3 engine on GPUs. One thread and one NCCL rank per GPU of this
// process; each rank's parameters, gradients and AdamW state live on its GPU (cuda_backend),
// sharded across the ranks. The "model" is two weight matrices pulled towards a target value,
// loss = 0.5 * ||w - target||^2, so its gradient is w - target and the loss must fall.
//
// What to take from it:
//   - scopes hand out device pointers: the training stack's kernels read the gathered weights
//     and accumulate (+=) into the gradient buffers;
//   - launch them on backend.make_stream(), the compute stream: the engine makes it wait for
//     the gathers a scope needs and makes its reductions wait for the kernels a backward scope
//     ran, so no other synchronisation is needed;
//   - with the communicator in nccl_completion::enqueue mode, the gather of the next module and
//     the reduction of the last one run on streams of their own while the kernels run
//     (engine_config::overlap, on by default);
//   - step() clips, runs AdamW on the shards, and reports the global gradient norm.
//
// Usage: 03_gpu_engine [steps]   (default 20). Without a GPU it says so and exits with 77.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "zshard/backend/cuda_backend.hpp"
#include "zshard/comm/nccl_ranks.hpp"
#include "zshard/engine/engine.hpp"

namespace {

constexpr float target = 0.5f;

// grad += w - target: the gradient of 0.5 * (w - target)^2.
__global__ void pull_towards_target(const float* w, float* grad, std::size_t n) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    grad[i] += w[i] - target;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  const auto census = zshard::cuda::count_devices();
  if (census.count == 0) {
    std::printf("skipped: no CUDA device (%s); this example needs one\n", census.reason.c_str());
    return 77;  // as the GPU tests: run.sh fails on it when nvidia-smi sees a GPU
  }
  std::vector<int> devices;
  for (int d = 0; d < census.count; ++d) devices.push_back(d);

  zshard::model_spec spec;
  const auto w1 = spec.add_param("w1", {512, 512}, {.init = zshard::init::uniform(-1, 1, 1)});
  const auto w2 = spec.add_param("w2", {512, 1000}, {.init = zshard::init::uniform(-1, 1, 2)});
  const auto layer1 = spec.add_module("layer1", {w1});
  const auto layer2 = spec.add_module("layer2", {w2});

  zshard::engine_config cfg;
  cfg.adamw.lr = 0.05f;
  cfg.adamw.weight_decay = 0.0f;

  try {
    zshard::nccl_options comm_options;
    comm_options.completion = zshard::nccl_completion::enqueue;  // collectives do not block the host
    zshard::run_nccl_ranks(devices, [&](zshard::nccl_comm& comm) {
      zshard::cuda_backend backend({.device = comm.device()});
      const auto stream = backend.make_stream();
      {
        zshard::engine<zshard::cuda_backend, zshard::nccl_comm> eng(backend, comm, spec, cfg);
        for (int step = 1; step <= steps; ++step) {
          { auto g = eng.forward(layer1); }  // a real model would run its forward kernels here
          { auto g = eng.forward(layer2); }
          eng.begin_backward();
          for (auto m : {layer2, layer1}) {
            auto g = eng.backward(m);
            const std::size_t n = g.grad(0).numel();
            pull_towards_target<<<256, 256, 0, stream.handle()>>>(g.param_data<float>(0), g.grad_data(0), n);
            ZSHARD_CUDA_CHECK(cudaGetLastError());
          }
          eng.end_backward();
          const auto report = eng.step();
          // grad_norm = ||w - target|| over the whole model, gathered from every rank's shards
          if (comm.rank() == 0 && (step == 1 || step % 5 == 0))
            std::printf("step %3d  loss %10.2f  (%d GPU%s, device memory %s peak on rank 0)\n", step,
                        0.5 * report.grad_norm * report.grad_norm, comm.size(), comm.size() > 1 ? "s" : "",
                        zshard::format_bytes(double(backend.ledger().total_peak())).c_str());
        }
      }
    }, comm_options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "03_gpu_engine: %s\n", e.what());
    return 1;
  }
  return 0;
}

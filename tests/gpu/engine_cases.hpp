#pragma once
// The engine on cuda_backend + nccl_comm against the float64 single-process reference (I7):
// the host equivalence tests (tests/engine/test_engine_equivalence.cpp) on GPUs. Part of
// test_cuda.cu's single translation unit. World sizes: 1, and 2 and all GPUs when there are more.

namespace engine_cases {

using toy::check_equal;  // tests/engine/equivalence_check.hpp: the host tests' comparison
inline toy::train_options base(int world) { return toy::base_options(world); }

inline std::vector<int> worlds() {
  const int n = std::min(gpu_test::device_count(), 8);
  std::vector<int> w = {1};
  if (n >= 2) w.push_back(2);
  if (n > 2) w.push_back(n);
  return w;
}

inline const char* name(zshard::nccl_completion c) { return c == zshard::nccl_completion::wait ? "wait" : "enqueue"; }

}  // namespace engine_cases

TEST_CASE("engine on GPUs: sharded f32 training equals the float64 single-process reference") {
  for (int world : engine_cases::worlds()) {
    for (auto mode : {zshard::nccl_completion::wait, zshard::nccl_completion::enqueue}) {
      for (int variant = 0; variant < 4; ++variant) {
        auto o = engine_cases::base(world);
        std::string what = "world " + std::to_string(world) + ", " + engine_cases::name(mode);
        if (variant == 3) {
          o.engine.overlap = false;  // every other case runs gathers and reductions on their own streams
          what += ", overlap off";
        }
        if (variant == 1) {
          o.micro_batches = 3;
          what += ", 3 micro-batches";
        }
        if (variant == 2) {
          o.micro_batches = 2;
          o.engine.clip_norm = 0.05;
          what += ", 2 micro-batches, clipping";
        }
        const auto got = gpu_test::train_on_gpus(o, mode);
        engine_cases::check_equal(got, toy::train_reference(o), dtype::f32, what);
        if (variant == 2)
          for (const auto& r : got.reports) CHECK(r.clip_coefficient < 1.0);
      }
    }
  }
}

TEST_CASE("engine on GPUs: bf16 working parameters within one bf16 ulp of the reference") {
  for (int world : engine_cases::worlds()) {
    auto o = engine_cases::base(world);
    o.engine.param_dtype = dtype::bf16;
    o.micro_batches = 2;
    engine_cases::check_equal(gpu_test::train_on_gpus(o, zshard::nccl_completion::enqueue), toy::train_reference(o),
                              dtype::bf16, "bf16, world " + std::to_string(world));
  }
}

TEST_CASE("engine on GPUs: f16 with loss scaling, a forced overflow skips the step and lowers the scale") {
  for (int world : engine_cases::worlds()) {
    auto o = engine_cases::base(world);
    o.engine.param_dtype = dtype::f16;
    o.engine.loss_scale = {.enabled = true, .initial_scale = 1024.f, .growth_factor = 2.f, .backoff_factor = 0.5f,
                           .growth_interval = 2, .min_scale = 1.f};
    o.steps = 5;
    o.overflow_step = 1;
    const auto got = gpu_test::train_on_gpus(o, zshard::nccl_completion::wait);
    engine_cases::check_equal(got, toy::train_reference(o), dtype::f16, "f16, world " + std::to_string(world));
    REQUIRE(got.reports.size() == 5);
    CHECK(got.reports[1].skipped);
    CHECK(got.reports[1].loss_scale == 512.f);
    CHECK(got.reports[3].loss_scale == 1024.f);
  }
}

TEST_CASE("engine on GPUs with the host Offloader (optimizer state in pinned host memory) equals the reference") {
  struct host_offload : zshard::default_policies {
    using offloader = zshard::offload::host_adam;
  };
  for (int world : engine_cases::worlds()) {
    for (dtype t : {dtype::f32, dtype::bf16}) {
      auto o = engine_cases::base(world);
      o.engine.param_dtype = t;
      o.micro_batches = 2;
      engine_cases::check_equal(gpu_test::train_on_gpus<host_offload>(o, zshard::nccl_completion::enqueue),
                                toy::train_reference(o), t,
                                "host_adam, " + std::string(zshard::to_string(t)) + ", world " + std::to_string(world));
    }
  }
}

TEST_CASE("engine on GPUs with parameters in pinned host memory (uploads on the copy stream) and state on NVMe") {
  struct host_offload : zshard::default_policies {
    using offloader = zshard::offload::host_adam;
  };
  for (int world : engine_cases::worlds()) {
    for (bool nvme : {false, true}) {
      auto o = engine_cases::base(world);
      o.engine.param_dtype = dtype::bf16;
      o.micro_batches = 2;
      o.engine.offload.params = zshard::offload_tier::host;  // cudaMemcpyAsync from pinned memory per gather
      if (nvme) {
        o.engine.offload.optimizer_state = zshard::offload_tier::nvme;
        o.engine.offload.nvme_path = std::filesystem::temp_directory_path().string();
        o.engine.offload.nvme_chunk_numel = 1024;
        o.engine.offload.nvme_buffer_count = 3;
      }
      engine_cases::check_equal(gpu_test::train_on_gpus<host_offload>(o, zshard::nccl_completion::enqueue),
                                toy::train_reference(o), dtype::bf16,
                                std::string("parameters offloaded") + (nvme ? ", state on NVMe" : "") + ", world " +
                                    std::to_string(world));
    }
  }
}

TEST_CASE("engine on GPUs: hybrid sharding (replicas x shard group, ncclCommSplit) equals the reference") {
  const int n = std::min(gpu_test::device_count(), 8);
  if (n < 2) return;  // one GPU: no replicas
  for (int group : {1, n % 2 == 0 && n >= 4 ? 2 : n}) {
    for (bool separate_reduce : {false, true}) {
      auto o = engine_cases::base(n);
      o.micro_batches = 2;
      o.engine.hybrid.shard_group_size = group;
      const std::string what = std::to_string(n / group) + " x " + std::to_string(group) +
                               (separate_reduce ? ", reductions on a second communicator" : "");
      engine_cases::check_equal(gpu_test::train_on_gpus(o, zshard::nccl_completion::enqueue, separate_reduce),
                                toy::train_reference(o), dtype::f32, what);
    }
  }
}

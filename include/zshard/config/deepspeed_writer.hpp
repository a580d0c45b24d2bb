#pragma once
// Writes an engine_config (and the run's batch shape) as a DeepSpeed JSON config that
// read_deepspeed_config (config/deepspeed_config.hpp) maps back to the same options: what
// zshard_plan --fit --write-deepspeed-config FILE writes for the configuration it chose, so a
// run can be started from it (the main job: 02_train_gpt --deepspeed-config FILE) and a
// DeepSpeed user reads it in the keys they know.
//
//   zero_optimization   stage 3, stage3_max_live_parameters, stage3_prefetch_bucket_size,
//                       stage3_param_persistence_threshold, stage3_max_reuse_distance,
//                       reduce_bucket_size, overlap_comm, mics_shard_size (hybrid sharding only),
//                       offload_optimizer {device none | cpu | nvme, nvme_path, buffer_count,
//                       pin_memory}, offload_param {device none | cpu, pin_memory}
//   aio.thread_count    offload.nvme_io_threads (optimizer state on NVMe)
//   bf16 / fp16         param_dtype (fp16 with its loss-scale settings)
//   optimizer           AdamW: lr, betas, eps, weight_decay
//   gradient_clipping, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
//   train_batch_size (ranks x micro-batch x accumulation)
// What DeepSpeed has no key for is not written and reads back as zshard's default:
// allow_oversized_module, hybrid.ranks_per_node, clip_norm_type, parameter groups, the host
// optimizer's threads, tiles and staging. Needs nlohmann-json, as the reader does.
#if !__has_include(<nlohmann/json.hpp>)
#error \
    "zshard/config/deepspeed_writer.hpp needs nlohmann-json: install nlohmann-json3-dev (or the nlohmann_json package) and link nlohmann_json::nlohmann_json"
#endif
#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <string>

#include "zshard/core/error.hpp"
#include "zshard/engine/engine_config.hpp"

namespace zshard::config {

// The run around the engine: what DeepSpeed's batch keys and offload_optimizer say.
struct deepspeed_run {
  int world = 1;
  int micro_batch_size = 1;             // sequences per micro-batch and rank
  int gradient_accumulation_steps = 1;  // micro-batches per optimizer step
  bool offload_optimizer = false;       // offload::host_adam (engine.offload.optimizer_state says host or nvme)
};

namespace detail {
// A float as the shortest decimal that reads back to it (0.003, not 0.003000000026077032).
inline double shortest(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::stod(std::string(buf, r.ptr));
}
}  // namespace detail

inline nlohmann::ordered_json deepspeed_json(const engine_config& c, const deepspeed_run& run) {
  c.validate();
  ZSHARD_REQUIRE(run.world >= 1 && run.micro_batch_size >= 1 && run.gradient_accumulation_steps >= 1,
                 error_kind::config, "deepspeed_run: world, micro_batch_size and gradient_accumulation_steps must be >= 1");
  ZSHARD_REQUIRE(run.offload_optimizer || (c.offload.params == offload_tier::device &&
                                           c.offload.optimizer_state != offload_tier::nvme),
                 error_kind::config,
                 "parameters on the host or optimizer state on NVMe need the host optimizer (offload_optimizer)");
  using json = nlohmann::ordered_json;
  json j;
  j["train_batch_size"] = 1LL * run.world * run.micro_batch_size * run.gradient_accumulation_steps;
  j["train_micro_batch_size_per_gpu"] = run.micro_batch_size;
  j["gradient_accumulation_steps"] = run.gradient_accumulation_steps;
  j["gradient_clipping"] = c.clip_norm;
  if (c.param_dtype == dtype::f16) {
    json f{{"enabled", true}};
    const auto& ls = c.loss_scale;
    const int power = int(std::lround(std::log2(double(ls.initial_scale))));
    ZSHARD_REQUIRE(std::ldexp(1.0f, power) == ls.initial_scale, error_kind::config,
                   "loss_scale.initial_scale = " + std::to_string(ls.initial_scale) +
                       " is not a power of two: DeepSpeed's fp16.initial_scale_power cannot say it");
    f["initial_scale_power"] = power;
    f["loss_scale_window"] = ls.growth_interval;
    f["min_loss_scale"] = detail::shortest(ls.min_scale);
    j["fp16"] = f;
  } else {
    j["bf16"] = {{"enabled", c.param_dtype == dtype::bf16}};
  }
  j["optimizer"] = {{"type", "AdamW"},
                    {"params",
                     {{"lr", detail::shortest(c.adamw.lr)},
                      {"betas", {detail::shortest(c.adamw.beta1), detail::shortest(c.adamw.beta2)}},
                      {"eps", detail::shortest(c.adamw.eps)},
                      {"weight_decay", detail::shortest(c.adamw.weight_decay)}}}};
  json z;
  z["stage"] = 3;
  z["stage3_max_live_parameters"] = c.prefetch.max_live_numel;
  z["stage3_prefetch_bucket_size"] = c.prefetch.prefetch_numel;
  z["stage3_param_persistence_threshold"] = c.partition.persistence_threshold_numel;
  z["stage3_max_reuse_distance"] = c.prefetch.max_reuse_distance;
  z["reduce_bucket_size"] = c.reduce.reduce_bucket_numel;
  z["overlap_comm"] = c.overlap;
  if (c.hybrid.shard_group_size > 0) z["mics_shard_size"] = c.hybrid.shard_group_size;
  const bool nvme = run.offload_optimizer && c.offload.optimizer_state == offload_tier::nvme;
  json opt{{"device", !run.offload_optimizer ? "none" : nvme ? "nvme" : "cpu"}};
  if (nvme) {
    ZSHARD_REQUIRE(!c.offload.nvme_path.empty(), error_kind::config,
                   "offload.optimizer_state = nvme needs offload.nvme_path (DeepSpeed's offload_optimizer.nvme_path)");
    opt["nvme_path"] = c.offload.nvme_path;
    opt["buffer_count"] = c.offload.nvme_buffer_count;
  }
  opt["pin_memory"] = c.offload.pin_memory;
  z["offload_optimizer"] = opt;
  z["offload_param"] = {{"device", c.offload.params == offload_tier::host ? "cpu" : "none"},
                        {"pin_memory", c.offload.pin_memory}};
  j["zero_optimization"] = z;
  if (nvme) j["aio"] = {{"thread_count", c.offload.nvme_io_threads}};
  return j;
}

// The same, as text (two-space indents, a newline at the end).
inline std::string write_deepspeed_config(const engine_config& c, const deepspeed_run& run) {
  return deepspeed_json(c, run).dump(2) + "\n";
}

}  // namespace zshard::config

#pragma once
// DeepSpeed config keys zshard accepts with no counterpart, each with why (deepspeed_config.hpp notes).
#include <string_view>
#include <utility>

namespace zshard::config::detail {

// Keys DeepSpeed accepts that change nothing in zshard, and why.
inline const char* no_counterpart(std::string_view key) {
  static const std::pair<std::string_view, const char*> table[] = {
      {"zero_optimization.contiguous_gradients", "zshard's gradient buckets are contiguous already"},
      {"zero_optimization.sub_group_size", "the host optimizer works in host_tile_numel tiles (offload_config)"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", "checkpoints are zshard's own (sharded)"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", "checkpoints are zshard's own (sharded)"},
      {"zero_optimization.allgather_partitions", "zshard always all-gathers parameters (stage 3)"},
      {"zero_optimization.allgather_bucket_size", "gathers are per module, bounded by max_live_numel"},
      {"zero_optimization.reduce_scatter", "zshard always reduce-scatters gradients"},
      {"zero_optimization.round_robin_gradients", "gradient shards are even slices of every parameter"},
      {"zero_optimization.memory_efficient_linear", "zshard does not wrap the model's layers"},
      {"zero_optimization.stage3_model_persistence_threshold", "persistence is per parameter only"},
      {"zero_optimization.offload_optimizer.fast_init", "host state is initialised from the shards"},
      {"zero_optimization.offload_optimizer.ratio", "the whole optimizer runs where offload_optimizer says"},
      {"zero_optimization.offload_optimizer.pipeline", "NVMe chunks are always read ahead and written behind"},
      {"zero_optimization.offload_optimizer.pipeline_read", "NVMe chunks are always read ahead"},
      {"zero_optimization.offload_optimizer.pipeline_write", "NVMe chunks are always written behind"},
      {"zero_optimization.offload_param.buffer_count",
       "parameter shards are uploaded per gather group, bounded by the prefetch window (no NVMe buffers)"},
      {"zero_optimization.offload_param.buffer_size",
       "parameter shards are uploaded per gather group, bounded by the prefetch window (no NVMe buffers)"},
      {"zero_optimization.offload_param.max_in_cpu", "every offloaded shard is in host memory"},
      {"zero_optimization.offload_param.nvme_path", "parameter shards stay in host memory"},
      {"aio.block_size", "whole chunks are read and written (offload_config::nvme_chunk_numel)"},
      {"aio.queue_depth", "each I/O thread has one chunk in flight"},
      {"aio.single_submit", "each I/O thread has one chunk in flight"},
      {"aio.overlap_events", "reads, writes and AdamW always overlap"},
      {"aio.use_gds", "chunks go through host memory"},
      {"fp16.hysteresis", "zshard's scaler backs off at the first overflow"},
      {"fp16.consecutive_hysteresis", "zshard's scaler backs off at the first overflow"},
      {"fp16.auto_cast", "the training stack owns its kernels' precision"},
      {"bf16.immediate_grad_update", "gradients are accumulated in f32 shards"},
      {"optimizer.params.torch_adam", "zshard's AdamW is its own"},
      {"optimizer.params.adam_w_mode", "zshard's Adam is AdamW (decoupled weight decay)"},
      {"optimizer.params.bias_correction", "zshard's AdamW always corrects the moments' bias"},
      {"scheduler", "learning-rate schedules belong to the training loop (engine::set_lr)"},
      {"steps_per_print", "the training loop prints"},
      {"wall_clock_breakdown", "use engine_config::trace for a timeline"},
      {"zero_allow_untested_optimizer", "zshard runs AdamW only"},
      {"communication_data_type", "collectives run in the parameters' dtype, gradients in f32"},
      {"prescale_gradients", "gradients are averaged by the reduce-scatter"},
      {"gradient_predivide_factor", "gradients are averaged by the reduce-scatter"},
      {"flops_profiler", "not part of zshard"},
      {"tensorboard", "not part of zshard"},
      {"wandb", "not part of zshard"},
      {"activation_checkpointing", "the training stack checkpoints (engine::recompute)"},
      {"data_types", "gradients are accumulated in f32"},
  };
  for (const auto& [k, why] : table)
    if (k == key) return why;
  return nullptr;
}

}  // namespace zshard::config::detail

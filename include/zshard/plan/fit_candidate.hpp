#pragma once
// One point of the fit's search space (plan/fit_search.hpp) and what it means for the engine:
// the engine_config and Offloader it runs with, the plan_options it is planned with, and the
// plan itself (the stage picks the planner; stage 3 alone until the stages land).
//
// A *family* is what decides the terms held for the whole run: the stage, where the optimizer
// state and the parameter shards live, and the shard group. Within a family the budgets
// (prefetch, max live, bucket) and the step's shape (micro-batch x accumulation, checkpointing)
// vary; the family's floor (what every one of its candidates holds) is planned once.
#include <cstddef>
#include <cstdint>
#include <string>

#include "zshard/core/error.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/partition/even_partitioner.hpp"
#include "zshard/plan/fit_model.hpp"
#include "zshard/plan/gpu_rates.hpp"
#include "zshard/plan/memory_plan.hpp"

namespace zshard::plan {

// Where AdamW's state lives: on the device (offload::on_device), in host memory
// (offload::host_adam), or in files on NVMe (host_adam with offload_config::optimizer_state = nvme).
enum class fit_optimizer : std::uint8_t { device, host, nvme };

constexpr const char* to_string(fit_optimizer o) noexcept {
  return o == fit_optimizer::device ? "device" : o == fit_optimizer::host ? "host" : "nvme";
}

struct fit_family {
  int stage = 3;
  fit_optimizer optimizer = fit_optimizer::device;
  offload_tier params = offload_tier::device;  // device or host
  int shard_group = 1;                         // ranks per shard group (the world: plain ZeRO)
  bool operator==(const fit_family&) const = default;
};

struct fit_candidate {
  fit_family family;
  std::size_t prefetch_numel = 0;
  std::size_t max_live_numel = 0;
  bool allow_oversized_module = false;
  std::size_t bucket_numel = 0;
  fit_step_shape step;
};

// The engine's options for `c`, starting from `base` (dtype, persistence threshold, AdamW, ...).
inline engine_config config_of(const fit_candidate& c, const engine_config& base, const fit_machine& machine,
                               const std::string& nvme_path) {
  engine_config cfg = base;
  const int world = machine.world();
  cfg.hybrid.shard_group_size = c.family.shard_group == world ? 0 : c.family.shard_group;
  cfg.prefetch.prefetch_numel = c.prefetch_numel;
  cfg.prefetch.max_live_numel = c.max_live_numel;
  cfg.prefetch.allow_oversized_module = c.allow_oversized_module;
  cfg.reduce.reduce_bucket_numel = c.bucket_numel;
  cfg.offload.params = c.family.params;
  cfg.offload.optimizer_state = c.family.optimizer == fit_optimizer::nvme ? offload_tier::nvme : offload_tier::host;
  if (c.family.optimizer == fit_optimizer::nvme && cfg.offload.nvme_path.empty()) cfg.offload.nvme_path = nvme_path;
  return cfg;
}

// How the plan is told about the run: the Offloader, the GPU's own terms, the host staging.
inline plan_options plan_options_of(const fit_candidate& c, const engine_config& cfg, const fit_machine& machine) {
  plan_options o;
  const bool host_optimizer = c.family.optimizer != fit_optimizer::device;
  o.optimizer = host_optimizer ? optimizer_location::host : optimizer_location::device;
  o.backend_memory_is_host = machine.rates.device_is_host;
  if (!machine.rates.device_is_host) {
    o.overheads = device_overheads::cuda_defaults();
    if (host_optimizer) o.host_staging_numel = cfg.offload.host_staging_numel;
    o.host_pinned = host_optimizer && cfg.offload.pin_memory;
  }
  return o;
}

// The plan of `c` on `machine`: the planner of its stage.
inline memory_plan plan_candidate(const fit_model& model, const fit_candidate& c, const engine_config& cfg,
                                  const fit_machine& machine, const training_schedule& schedule) {
  const plan_options o = plan_options_of(c, cfg, machine);
  switch (c.family.stage) {
    case 3:
      return plan_memory<partition::even>(model.spec, cfg, machine.world(), schedule, o);
    default:
      throw error(error_kind::config,
                  "ZeRO stage " + std::to_string(c.family.stage) + " is not planned by this version",
                  "search stage 3");
  }
}

// Per-node figures: every rank of a node holds the same (even partitioner).
inline std::size_t host_bytes_per_node(const memory_plan& p, const fit_machine& m) {
  return p.host.total_peak * std::size_t(m.ranks_per_node);
}
inline std::size_t nvme_bytes_per_node(const memory_plan& p, const fit_machine& m) {
  return p.nvme.total_peak * std::size_t(m.ranks_per_node);
}

// "host optimizer, parameters on the device, shard group 8" and the like.
inline std::string describe(const fit_family& f, int world) {
  std::string s = "stage " + std::to_string(f.stage) + ", optimizer on " +
                  (f.optimizer == fit_optimizer::device ? std::string("the device")
                   : f.optimizer == fit_optimizer::host ? std::string("the host")
                                                        : std::string("NVMe")) +
                  ", parameters on the " + (f.params == offload_tier::host ? "host" : "device") + ", ";
  s += world == 1                ? std::string("one rank")
       : f.shard_group == world ? "sharded over all " + std::to_string(world) + " ranks"
       : f.shard_group == 1     ? std::string("replicated on every rank (shard groups of 1)")
                                : "shard groups of " + std::to_string(f.shard_group);
  return s;
}

// "every block", "every 2nd block", "none".
inline std::string checkpoint_words(int every) {
  if (every <= 0) return "none";
  if (every == 1) return "every block";
  const std::string n = std::to_string(every);
  const char* suffix = every % 10 == 2 && every % 100 != 12 ? "nd" : every % 10 == 3 && every % 100 != 13 ? "rd" : "th";
  return "every " + n + suffix + " block";
}

}  // namespace zshard::plan

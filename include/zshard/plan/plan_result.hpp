#pragma once
// What a memory plan says (plan/memory_plan.hpp computes it): per ledger, a peak per
// category, the total peak, the categories at that moment and where it happened; for the
// device, also the terms a GPU adds that the ledger does not see (plan/device_overheads.hpp).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zshard/core/memory_ledger.hpp"
#include "zshard/offload/offload_config.hpp"
#include "zshard/plan/device_overheads.hpp"

namespace zshard::plan {

enum class optimizer_location { device, host };   // offload::on_device / offload::host_adam
// Which Prefetcher the run uses, as far as the planner is concerned (plan/policy_options.hpp
// derives it from a policies type): prefetch::on_demand, prefetch::trace (the default; the plan
// replays its decisions), or any other (any: the plan assumes only what the engine enforces of
// every Prefetcher, the live budget, so gathered parameters are bounded by max_live_numel filled
// with the widest parameters; see plan/gathered_bound.hpp).
enum class prefetch_policy { on_demand, trace, any };

struct plan_options {
  optimizer_location optimizer = optimizer_location::device;
  prefetch_policy prefetcher = prefetch_policy::trace;
  // host_adam's staging (offload_config::host_staging_numel) when the backend's memory is not
  // host memory (CUDA); 0 for the host and phantom backends, which stage nothing.
  std::size_t host_staging_numel = 0;
  // The host backend: gradient shards and working values stay where they are (no transfer is
  // counted in memory_plan::moved). Off for a GPU and for the phantom backend that stands in for one.
  bool backend_memory_is_host = false;
  // The engine's construction on a backend that holds storage (initial values staged as f32,
  // the cross-rank model check). A phantom backend skips it; leaving it on only adds a small
  // scratch figure that the reductions usually exceed anyway.
  bool initialization = true;
  // What the device holds beyond the ledger (CUDA context, NCCL, pool, workspaces); none for
  // the host and phantom backends, device_overheads::cuda_defaults() for a GPU.
  device_overheads overheads = device_overheads::none();
  // Modules the run keeps gathered from their counted forward to their backward
  // (engine::set_keep_gathered_until_backward), by name: held as the engine holds them.
  std::vector<std::string> keep_gathered_until_backward{};
  // engine::set_gradient_sync(false) for every micro-batch of a step but its last (no-sync
  // accumulation): full gradients stay until the last micro-batch reduces them. Each
  // set_gradient_sync call's argument check is charged where the call may come (between
  // micro-batches, over the gradients held then).
  bool no_sync = false;
  // The host ledger is page-locked memory (cuda_backend::pinned() with offload_config::pin_memory):
  // reported, not charged otherwise.
  bool host_pinned = false;
  // Parameters frozen at registration (param_options::trainable = false) that the run unfreezes
  // with engine::set_trainable(p, true), by name, in stages: the parameters of a stage are
  // unfrozen at the same step (between steps), the stages in this order. Unfreezing creates a
  // parameter's optimizer state and gradient shard (kept if it is frozen again), so the plan
  // holds those from construction on for every parameter listed, and walks the schedule once
  // per trainable set the run goes through: as registered, then after each stage.
  // Empty (the default): one stage of every parameter frozen at registration, so that the plan
  // bounds a run that unfreezes them all at some step as well as one that never does; set
  // frozen_params_stay_frozen to assert that none is ever unfrozen (the plan then holds no
  // state for them). A run that unfreezes only some parameters of a stage goes through a
  // trainable set the plan did not walk: list its stages as it runs them.
  std::vector<std::vector<std::string>> unfreeze_stages{};
  bool frozen_params_stay_frozen = false;
};

// One ledger's predicted peaks, laid out like memory_ledger's.
struct ledger_plan {
  std::string name;
  std::array<std::size_t, mem_category_count> peak{};           // per category, each at its own time
  std::array<std::size_t, mem_category_count> at_total_peak{};  // per category when the total peaked
  std::size_t total_peak = 0;
  std::string peak_phase;  // where the total peaked, e.g. "step 2, backward of head: reduce-scatter of head.weight"

  std::size_t peak_of(mem_category c) const noexcept { return peak[static_cast<std::size_t>(c)]; }
  std::size_t at_peak_of(mem_category c) const noexcept { return at_total_peak[static_cast<std::size_t>(c)]; }
};

// Bytes one rank sends in one optimizer step, by the communicator they travel on (ring
// schedules, as null_comm counts them: all-gather and reduce-scatter (n - 1) blocks, all-reduce
// 2 (n - 1) / n of the buffer). Exact when max_live_numel does not stop gathers ahead (then the
// walk's gathers are the run's; see plan/gathered_bound.hpp).
struct step_traffic {
  std::uint64_t shard_group = 0;    // gathers, reduce-scatters and replicated all-reduces in the shard group
  std::uint64_t across_groups = 0;  // hybrid: all-reduces of gradient shards across replica groups
  std::uint64_t world = 0;          // the ranks' step (and scope) checks, over every rank
  std::uint64_t total() const noexcept { return shard_group + across_groups + world; }
};

struct memory_plan {
  int world = 1;
  int shard_group = 1;  // ranks per shard group (= world unless hybrid)
  // The last step walked (the steady state of a one-program schedule), with the trainable set
  // as registered. Exact when max_live_numel does not stop gathers ahead; with
  // prefetch_policy::any only the scopes' own gathers are counted. Control calls' checks
  // (set_gradient_sync, set_trainable, ...) are not counted.
  step_traffic traffic;
  ledger_plan device;                  // the backend's ledger
  ledger_plan host;                    // host_adam's ledger (offloaded state); empty with the optimizer on device
  ledger_plan nvme;                    // the NVMe tier's files (offload_config::optimizer_state = nvme); else empty
  // Whether the host ledger is page-locked memory (a GPU backend with offload_config::pin_memory);
  // as planned with (plan_options::host_pinned).
  bool host_pinned = false;
  tier_traffic moved;                  // bytes one step moves between tiers (the last step walked)
  std::size_t max_gathered_numel = 0;  // resident gathered elements at most (the I5 figure)
  device_overheads overheads;          // as planned with (plan_options::overheads)
  int steps_simulated = 0;             // optimizer steps walked until the schedule's state repeats (per trainable set)
  int trainable_sets = 1;              // the trainable sets walked (plan_options::unfreeze_stages)

  // The device's total: the ledger's peak plus what the GPU adds beside it.
  std::size_t device_total() const noexcept { return device.total_peak + overheads.total(device.total_peak); }
  bool fits(std::size_t device_bytes) const noexcept { return device_total() <= device_bytes; }
};

}  // namespace zshard::plan

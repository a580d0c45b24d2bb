#pragma once
// The planner's terms for the tiers beyond the device (docs/DESIGN.md, "offload tiers"): what
// the host Offloader (offload::host_adam) keeps in its host ledger, what the NVMe tier keeps in
// files, and the bytes a step moves between the device and the host and to and from the disk.
// plan/plan_walk.hpp charges the device side (no device shard for an offloaded parameter, its
// upload buffer at each gather) and asks these for the rest. Every figure is the one the
// offloader's own allocations and counters produce (host_adam.hpp, param_tier.hpp,
// nvme_state.hpp), so a phantom run equals it to the byte.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/offload/nvme_state.hpp"
#include "zshard/optim/adamw_dispatch.hpp"
#include "zshard/partition/shard_layout.hpp"
#include "zshard/plan/plan_result.hpp"

namespace zshard::plan::detail {

class offload_terms {
 public:
  // has_state: per parameter, whether it has optimizer state (trainable, or frozen and planned as
  // unfrozen later: plan/trainable_stages.hpp).
  offload_terms(const model_spec& spec, const engine_config& cfg, const std::vector<shard_layout>& layouts,
                const plan_options& opt, const std::vector<bool>& has_state)
      : spec_(spec), cfg_(cfg), layouts_(layouts), opt_(opt), has_state_(has_state) {
    const bool host_optimizer = opt.optimizer == optimizer_location::host;
    ZSHARD_REQUIRE(host_optimizer || cfg.offload.params == offload_tier::device, error_kind::config,
                   "offload_config.params = " + std::string(to_string(cfg.offload.params)) +
                       " with offload::on_device, which updates working shards on the device",
                   "use offload::host_adam, which keeps parameter shards in host memory and updates them there");
    ZSHARD_REQUIRE(host_optimizer || cfg.offload.optimizer_state != offload_tier::nvme, error_kind::config,
                   "offload_config.optimizer_state = nvme with offload::on_device, which keeps it on the device",
                   "use offload::host_adam for optimizer state on NVMe");
  }

  // Whether p's working shard lives in host memory (param_store::offloaded).
  bool offloaded(param_id p) const noexcept {
    return cfg_.offload.params != offload_tier::device && !layouts_[p].replicated;
  }
  // What a gather of p uploads first (its shard, in the working dtype), 0 unless offloaded.
  std::size_t upload_bytes(param_id p) const noexcept { return offloaded(p) ? layouts_[p].shard_numel * elem(p) : 0; }
  // host_adam copies each reduced gradient to the host unless the backend's memory is host memory.
  bool grads_cross() const noexcept {
    return opt_.optimizer == optimizer_location::host && !opt_.backend_memory_is_host;
  }
  std::size_t grad_down_bytes(param_id p) const noexcept { return grads_cross() ? 4 * layouts_[p].shard_numel : 0; }
  bool on_nvme() const noexcept {
    return opt_.optimizer == optimizer_location::host && cfg_.offload.optimizer_state == offload_tier::nvme;
  }

  // host_adam's flat arrays: Σ over parameters with state of the shard rounded to the tile granule.
  std::size_t flat_numel() const {
    std::size_t n = 0;
    for (param_id p = 0; p < spec_.params().size(); ++p)
      if (has_state_[p]) n += optim::round_up_to_granule(layouts_[p].shard_numel);
    return n;
  }
  std::size_t chunks() const {
    const std::size_t c = cfg_.offload.nvme_chunk_numel;
    return on_nvme() ? (flat_numel() + c - 1) / c : 0;
  }
  std::size_t chunk_bytes() const noexcept { return 3 * cfg_.offload.nvme_chunk_numel * sizeof(float); }

  // Bytes one optimizer step moves (no step skipped by an overflow): the working values of the
  // trainable parameters the device keeps, up through host_adam's staging; the whole NVMe state,
  // read and written once. Uploads and gradients are counted where they happen (plan_walk).
  std::uint64_t step_working_up() const {
    if (opt_.optimizer != optimizer_location::host || opt_.backend_memory_is_host) return 0;
    std::uint64_t b = 0;
    for (param_id p = 0; p < spec_.params().size(); ++p)
      if (spec_.param(p).trainable && !offloaded(p)) b += layouts_[p].shard_numel * elem(p);
    return b;
  }
  std::uint64_t step_disk_bytes() const { return std::uint64_t(chunks()) * chunk_bytes(); }

  // The host Offloader's ledger: held from construction to the end.
  ledger_plan host() const {
    ledger_plan r;
    r.name = "host";
    if (opt_.optimizer != optimizer_location::host) return r;
    const std::size_t n = flat_numel();
    std::size_t shards = 0;
    for (param_id p = 0; p < spec_.params().size(); ++p) shards += upload_bytes(p);
    put(r, mem_category::sharded_params, shards);
    put(r, mem_category::optimizer_state,
        on_nvme() ? offload::nvme_buffers(cfg_.offload, chunks()) * chunk_bytes() : 3 * 4 * n);
    put(r, mem_category::grad_shards, 4 * n);
    put(r, mem_category::scratch, 2 * 4 * opt_.host_staging_numel);
    r.peak_phase = "construction (held for the whole run)";
    return r;
  }
  // The NVMe tier's files: two slots of every chunk.
  ledger_plan nvme() const {
    ledger_plan r;
    r.name = "nvme";
    if (!on_nvme()) return r;
    put(r, mem_category::optimizer_state, 2 * chunks() * chunk_bytes());
    r.peak_phase = "construction (the files' size)";
    return r;
  }

 private:
  std::size_t elem(param_id p) const { return size_of(spec_.param(p).type.value_or(cfg_.param_dtype)); }
  static void put(ledger_plan& r, mem_category c, std::size_t bytes) {
    r.peak[std::size_t(c)] = r.at_total_peak[std::size_t(c)] = bytes;
    r.total_peak += bytes;
  }

  const model_spec& spec_;
  const engine_config& cfg_;
  const std::vector<shard_layout>& layouts_;
  const plan_options& opt_;
  const std::vector<bool>& has_state_;
};

}  // namespace zshard::plan::detail

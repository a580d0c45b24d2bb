#pragma once
// The fit's time model (docs/fit_time_model.md): one rank's predicted step time for a candidate,
// as a sum of terms a user can check, from the plan's bytes and the machine's rates.
//
//   compute    FLOPs of the step program (every forward, recompute and backward scope: the
//              model's forward FLOPs per token x tokens, x2 for a backward) at gemm_tflops x
//              compute_efficiency; `recompute` is the part spent re-running checkpointed blocks
//   gather     all-gathers in the shard group: bytes (the plan's, less the reductions'; never
//              below one gather of each parameter a micro-batch uses) at the group's link, plus
//              a latency per collective (intra-node when the group fits in a node)
//   reduce     reduce-scatters (and replicated all-reduces) in the shard group, the same way
//   across     hybrid: all-reduces of gradient shards across replica groups (inter-node link
//              when there are several nodes)
//   pcie       uploads of offloaded parameter shards, gradient shards to the host, updated
//              working values back (the plan's memory_plan::moved) at pcie_gbps
//   nvme       the optimizer state read and written per step, this rank's share of the node's
//              drives (ranks_per_node ranks share nvme_gbps)
//   optimizer  AdamW over this rank's state: host_adam_gelems on the host (or the host
//              backend), 34 bytes per element at hbm_gbps on a device
//
// Overlap, as the engine's schedule allows it (engine_config::overlap on a backend with role
// streams: CUDA): gathers (and their uploads) run ahead on their own stream as far as the trace
// Prefetcher reaches, which is prefetch_numel elements: a share h = min(1, prefetch_numel / m)
// of them hides behind compute, m the typical gathered module (the 90th percentile of the
// sharded modules' sizes); reductions (and gradient shards to the host, and the replica
// all-reduces) overlap the rest of backward except the last bucket of each micro-batch, a share
// q = min(1, reduce_bucket_numel / gradient elements of a micro-batch). Hidden work shares the
// links, so it adds up and is hidden only up to compute:
//   step = max(compute, h·A + (1 - q)·B) + (1 - h)·A + q·B + checks + pcie_step + max(optimizer, nvme)
// with A = gather + uploads, B = reduce + across + gradient shards down; pcie_step (working values
// up after host AdamW) is in step() and exposed; the optimizer and its NVMe reads and writes
// overlap each other (chunks pipelined). Without overlap (the host backend) every term adds up.
//
// Every input is monotone: the search's lower bound (plan/fit_search.hpp) evaluates the same
// formula on byte counts no plan can go below, so no candidate it skips could be faster.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/partition/even_partitioner.hpp"
#include "zshard/plan/fit_candidate.hpp"
#include "zshard/plan/fit_model.hpp"
#include "zshard/plan/gpu_rates.hpp"
#include "zshard/plan/plan_result.hpp"

namespace zshard::plan {

// What a step does, counted from the model, the step program and the layouts alone (no plan).
struct step_volume {
  double flops = 0, recompute_flops = 0;  // per rank
  int micro_batches = 0;
  std::uint64_t reduce_bytes = 0;         // sent in the shard group by the Reducer (ring)
  std::uint64_t across_bytes = 0;         // hybrid: sent across replica groups
  std::uint64_t gather_lb_bytes = 0;      // one gather of every sharded parameter each micro-batch uses
  std::uint64_t upload_lb_bytes = 0;      // the same parameters' uploads when offloaded
  std::uint64_t grad_down_bytes = 0;      // gradient shards to the host (host optimizer on a GPU)
  std::uint64_t working_up_bytes = 0;     // updated working values back to the device per step
  std::uint64_t gather_collectives = 0, reduce_collectives = 0;
  std::size_t state_numel = 0;            // this rank's elements with optimizer state
  std::size_t grad_numel_per_micro_batch = 0;  // full gradients of a micro-batch (bucket tail)
  std::size_t typical_module_numel = 0;        // 90th percentile of the sharded modules' sizes
};

namespace detail {
inline std::uint64_t ring_all_gather(std::uint64_t block, int n) { return block * std::uint64_t(n - 1); }
inline std::uint64_t ring_all_reduce(std::uint64_t bytes, int n) {
  return n > 1 ? 2 * bytes * std::uint64_t(n - 1) / std::uint64_t(n) : 0;
}
}  // namespace detail

// Layouts of `model` as the candidate's stage lays them out over its shard group.
inline std::vector<shard_layout> fit_layouts(const fit_model& model, const fit_family& f, const engine_config& cfg) {
  const partition::even even{};
  std::vector<shard_layout> out;
  out.reserve(model.spec.params().size());
  for (param_id p = 0; p < model.spec.params().size(); ++p)
    out.push_back(even.layout(param_identity::of(model.spec, p, cfg.param_dtype), f.shard_group, cfg.partition));
  return out;
}

inline step_volume measure_step_volume(const fit_model& model, const fit_candidate& c, const engine_config& cfg,
                                       const fit_machine& machine, const step_program& program) {
  const model_spec& spec = model.spec;
  const std::vector<shard_layout> layouts = fit_layouts(model, c.family, cfg);
  const int g = c.family.shard_group, replicas = machine.world() / g;
  const bool host_opt = c.family.optimizer != fit_optimizer::device;
  const bool crosses = host_opt && !machine.rates.device_is_host;
  const bool offloaded_params = c.family.params == offload_tier::host;
  auto elem = [&](param_id p) { return size_of(spec.param(p).type.value_or(cfg.param_dtype)); };
  step_volume v;
  const double tokens = double(model.tokens_per_micro_batch(c.step));
  // compute, and the parameters each micro-batch touches
  std::vector<int> used_in(spec.params().size(), -1);
  std::vector<bool> backward_in(spec.params().size(), false);
  int mb = 0;
  auto per_micro_batch_reductions = [&] {
    for (param_id p = 0; p < spec.params().size(); ++p) {
      if (!backward_in[p]) continue;
      backward_in[p] = false;
      const auto& l = layouts[p];
      const std::uint64_t out = 4 * std::uint64_t(l.replicated ? l.numel : l.shard_numel);
      v.reduce_bytes += l.replicated ? detail::ring_all_reduce(out, g) : detail::ring_all_gather(out, g);
      if (replicas > 1) v.across_bytes += detail::ring_all_reduce(out, replicas);
      if (g > 1) ++v.reduce_collectives;
      if (crosses) v.grad_down_bytes += 4 * std::uint64_t(l.shard_numel);
    }
  };
  auto touch = [&](param_id p) {
    if (layouts[p].replicated || used_in[p] == mb) return;
    used_in[p] = mb;
    v.gather_lb_bytes += detail::ring_all_gather(layouts[p].shard_numel * elem(p), g);
    if (g > 1) ++v.gather_collectives;
    if (offloaded_params) v.upload_lb_bytes += layouts[p].shard_numel * elem(p);
  };
  for (const auto& e : program.events) {
    switch (e.kind) {
      case event_kind::open: {
        const double f = model.forward_flops_per_token[e.module] * tokens;
        if (e.scope == scope_kind::backward) {
          v.flops += 2 * f;
          for (param_id p : spec.module(e.module).params)
            if (spec.param(p).trainable) backward_in[p] = true;
        } else {
          v.flops += f;
          if (e.scope == scope_kind::recompute) v.recompute_flops += f;
        }
        for (param_id p : spec.module(e.module).params) touch(p);
        break;
      }
      case event_kind::gather_param:
        touch(e.param);
        break;
      case event_kind::export_params:
        for (param_id p = 0; p < spec.params().size(); ++p) touch(p);
        break;
      case event_kind::end_backward:
        per_micro_batch_reductions();
        ++mb;
        break;
      default:
        break;
    }
  }
  v.micro_batches = mb;
  std::vector<std::size_t> sizes;
  for (module_id m = 0; m < spec.modules().size(); ++m) {
    std::size_t n = 0;
    for (param_id p : spec.module(m).params)
      if (!layouts[p].replicated) n += layouts[p].padded_numel;
    if (n > 0) sizes.push_back(n);
  }
  if (!sizes.empty()) {
    const std::size_t k = std::min(sizes.size() - 1, sizes.size() * 9 / 10);
    std::nth_element(sizes.begin(), sizes.begin() + std::ptrdiff_t(k), sizes.end());
    v.typical_module_numel = sizes[k];
  }
  for (param_id p = 0; p < spec.params().size(); ++p) {
    if (!spec.param(p).trainable) continue;
    v.state_numel += layouts[p].shard_numel;
    v.grad_numel_per_micro_batch += layouts[p].padded_numel;
    if (crosses && !(offloaded_params && !layouts[p].replicated)) v.working_up_bytes += layouts[p].shard_numel * elem(p);
  }
  return v;
}

// The bytes a plan says one step sends and moves (memory_plan::traffic, ::moved); the search's
// lower bound passes what no plan goes below instead.
struct step_bytes {
  std::uint64_t shard_group = 0, across_groups = 0, world = 0;
  tier_traffic moved{};
};

inline step_bytes bytes_of(const memory_plan& p) { return {p.traffic.shard_group, p.traffic.across_groups, p.traffic.world, p.moved}; }

struct step_time_terms {
  double compute = 0, recompute = 0, gather = 0, reduce = 0, across = 0, pcie = 0, nvme = 0, optimizer = 0;
  double exposed = 0;  // communication and transfers not hidden behind compute
  double total = 0;

  // The largest term, by name.
  const char* dominant() const noexcept {
    const std::pair<const char*, double> t[] = {{"compute", compute}, {"gather", gather},   {"reduce", reduce},
                                                {"across", across},   {"pcie", pcie},       {"nvme", nvme},
                                                {"optimizer", optimizer}};
    const auto* best = &t[0];
    for (const auto& x : t)
      if (x.second > best->second) best = &x;
    return best->first;
  }
};

inline step_time_terms predict_step_time(const step_volume& v, const step_bytes& b, const fit_candidate& c,
                                         const engine_config& cfg, const fit_machine& machine) {
  const gpu_rates& r = machine.rates;
  const int g = c.family.shard_group, world = machine.world();
  const double gbps = 1e9, us = 1e-6;
  const bool group_in_node = g <= machine.ranks_per_node;
  const double bw_group = (group_in_node ? r.intra_node_gbps : r.inter_node_gbps) * gbps;
  const double lat_group = (group_in_node ? r.latency_us : r.inter_latency_us()) * us;
  const bool one_node = machine.nodes == 1;
  const double bw_wide = (one_node ? r.intra_node_gbps : r.inter_node_gbps) * gbps;
  const double lat_wide = (one_node ? r.latency_us : r.inter_latency_us()) * us;
  const auto div = [](double x, double rate) { return x > 0 ? (rate > 0 ? x / rate : 1e30) : 0.0; };

  step_time_terms t;
  t.compute = div(v.flops, r.gemm_tflops * 1e12 * r.compute_efficiency);
  t.recompute = div(v.recompute_flops, r.gemm_tflops * 1e12 * r.compute_efficiency);
  const std::uint64_t from_plan = b.shard_group > v.reduce_bytes ? b.shard_group - v.reduce_bytes : 0;
  const double gather_bytes = double(std::max(v.gather_lb_bytes, from_plan));
  t.gather = div(gather_bytes, bw_group) + double(v.gather_collectives) * lat_group;
  t.reduce = div(double(v.reduce_bytes), bw_group) + double(v.reduce_collectives) * lat_group;
  const int replicas = world / g;
  t.across = div(double(std::max(v.across_bytes, b.across_groups)), bw_wide) +
             (replicas > 1 ? double(v.reduce_collectives) * lat_wide : 0.0);
  const double checks = div(double(b.world), bw_wide);
  const std::uint64_t uploads_plan =
      b.moved.to_device > v.working_up_bytes ? b.moved.to_device - v.working_up_bytes : 0;
  const double up = div(double(std::max(v.upload_lb_bytes, uploads_plan)), r.pcie_gbps * gbps);
  const double down = div(double(std::max(v.grad_down_bytes, b.moved.to_host)), r.pcie_gbps * gbps);
  const double step_up = div(double(v.working_up_bytes), r.pcie_gbps * gbps);
  t.pcie = up + down + step_up;
  t.nvme = div(double(b.moved.disk_read + b.moved.disk_written) * machine.ranks_per_node, r.nvme_gbps * gbps);
  const bool host_adam = c.family.optimizer != fit_optimizer::device || r.device_is_host;
  t.optimizer = host_adam ? div(double(v.state_numel), r.host_adam_gelems * 1e9)
                          : div(34.0 * double(v.state_numel), r.hbm_gbps * gbps);

  const double a = t.gather + up, bwd = t.reduce + t.across + down;
  double core = 0;
  if (r.streams && cfg.overlap) {
    const double m = double(v.typical_module_numel);
    const double h = m > 0 ? std::min(1.0, double(c.prefetch_numel) / m) : 1.0;
    const double grads = double(v.grad_numel_per_micro_batch);
    const double q = grads > 0 ? std::min(1.0, double(c.bucket_numel) / grads) : 1.0;
    core = std::max(t.compute, h * a + (1 - q) * bwd) + (1 - h) * a + q * bwd;
  } else {
    core = t.compute + a + bwd;
  }
  t.exposed = core - t.compute + checks + step_up;
  t.total = core + checks + step_up + std::max(t.optimizer, t.nvme);
  return t;
}

}  // namespace zshard::plan

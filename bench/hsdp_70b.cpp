// Hybrid sharding for the seed scenario across nodes (bench/seed_scenario.hpp: Llama-3-70B at
// DeepSpeed's hook granularity, bf16, optimizer state on the host, each block a checkpointed
// segment, 2 micro-batches of 1 x 4096 tokens per step) on 2 nodes x 8 ranks. Question: what
// does hybrid sharding (shard within a node, replicate across the 2 nodes) save on the network
// between nodes, and what does it cost in per-rank memory, against ZeRO-3 over all 16 ranks?
//
// Both layouts are planned (plan_memory: before any run) and simulated (run_phantom: the real
// engine on the phantom backend and the null communicator, which counts each rank's bytes per
// collective, ring schedules). "Across nodes" is what one rank sends per step in collectives
// whose ranks sit on both nodes: under ZeRO-3 every collective (the world is one group spanning
// both nodes); under hybrid the all-reduces of gradient shards across the two replicas and the
// step's small check over the world. Gathers and reduce-scatters of the hybrid layout stay in
// the node.
//
// Prints a table, then the key figures as `name: value`.
#include <cstdio>
#include <iostream>

#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "seed_scenario.hpp"

using namespace zshard;
using namespace zshard::plan;
using namespace zshard_bench;

namespace {

constexpr int nodes = 2, ranks_per_node = 8, world = nodes * ranks_per_node;

double gib(double bytes) { return bytes / double(std::size_t{1} << 30); }

struct measured {
  memory_plan plan;
  phantom_result run;
  // per rank per step: inside the node, and in collectives spanning both nodes
  double plan_in_node = 0, plan_across = 0, run_in_node = 0, run_across = 0;
};

measured measure(const seed_scenario& seed, const transformer_model& model, int group) {
  const training_schedule schedule{{seed.program(model)}};
  engine_config cfg = seed.config();
  cfg.hybrid = {.shard_group_size = group, .ranks_per_node = ranks_per_node};
  measured m{plan_memory(model.spec, cfg, world, schedule, seed.options()),
             run_phantom<seed_policies>(model.spec, cfg, world, schedule, seed.steps, seed.device_budget)};
  const bool group_spans_nodes = m.plan.shard_group > ranks_per_node;
  const auto& t = m.plan.traffic;
  m.plan_in_node = group_spans_nodes ? 0.0 : double(t.shard_group);
  m.plan_across = double(t.across_groups + t.world) + (group_spans_nodes ? double(t.shard_group) : 0.0);
  const auto& r = m.run;
  m.run_in_node = group_spans_nodes ? 0.0 : double(r.shard_group_bytes_per_step);
  m.run_across = double(r.across_groups_bytes_per_step + r.world_bytes_per_step) +
                 (group_spans_nodes ? double(r.shard_group_bytes_per_step) : 0.0);
  return m;
}

}  // namespace

int main() {
  seed_scenario seed;
  seed.world = world;
  const transformer_model model = seed.model();
  std::printf(
      "%s (%.2fe9 parameters), %d nodes x %d ranks, bf16, optimizer on the host, checkpointed blocks,\n"
      "  %d micro-batches of %lld x %lld tokens per step, device budget %.0f GiB; per rank, per step (steady state)\n\n",
      seed.shape.name.c_str(), double(seed.shape.param_count()) / 1e9, nodes, ranks_per_node,
      seed.activations.micro_batches, static_cast<long long>(seed.activations.micro_batch),
      static_cast<long long>(seed.activations.seq_len), gib(double(seed.device_budget)));

  const measured zero3 = measure(seed, model, 0);
  const measured hsdp = measure(seed, model, ranks_per_node);

  std::printf("%-22s %-6s %-22s %-22s %-22s %-22s\n", "layout", "group", "device peak GiB", "host peak GiB",
              "sent in node GiB", "sent across nodes GiB");
  std::printf("%-22s %-6s %-10s %-11s %-10s %-11s %-10s %-11s %-10s %-11s\n", "", "", "plan", "run", "plan", "run",
              "plan", "run", "plan", "run");
  auto row = [](const char* name, const measured& m) {
    std::printf("%-22s %-6d %-10.2f %-11.2f %-10.2f %-11.2f %-10.2f %-11.2f %-10.2f %-11.2f\n", name,
                m.plan.shard_group, gib(double(m.plan.device.total_peak)), gib(double(m.run.peak())),
                gib(double(m.plan.host.total_peak)), gib(double(m.run.host ? m.run.host->total_peak() : 0)),
                gib(m.plan_in_node), gib(m.run_in_node), gib(m.plan_across), gib(m.run_across));
  };
  row("ZeRO-3 (16 ranks)", zero3);
  row("hybrid (2 x 8)", hsdp);

  std::printf("\nhybrid, per-rank peak by category (plan vs phantom run):\n");
  print_plan(std::cout, hsdp.plan, &hsdp.run.peak_step(), hsdp.run.host ? &*hsdp.run.host : nullptr);

  const bool plan_matches_run = hsdp.plan_across == hsdp.run_across && zero3.plan_across == zero3.run_across &&
                                hsdp.plan_in_node == hsdp.run_in_node;
  const bool within_plan = hsdp.run.peak() <= hsdp.plan.device.total_peak && zero3.run.peak() <= zero3.plan.device.total_peak;
  std::printf("\nplan bytes equal the phantom run's: %s; run peaks within plan: %s\n", plan_matches_run ? "yes" : "NO",
              within_plan ? "yes" : "NO");

  std::printf("zero3_cross_node_gib_per_step: %.2f\n", gib(zero3.run_across));
  std::printf("hsdp_cross_node_gib_per_step: %.2f\n", gib(hsdp.run_across));
  std::printf("zero3_peak_gib: %.2f\n", gib(double(zero3.run.peak())));
  std::printf("hsdp_cross_group_bytes_ratio: %.4f\n", hsdp.run_across / zero3.run_across);
  std::printf("hsdp_peak_gib: %.2f\n", gib(double(hsdp.run.peak())));
  return plan_matches_run && within_plan ? 0 : 1;
}

// The planner and the phantom run under hybrid sharding (replicas x shard group): the plan
// bounds the run's peak in every ledger category (I10) and counts each rank's bytes per step
// inside its shard group and across groups exactly as the null communicator does; a hybrid rank
// holds what a plain ZeRO-3 rank of a world of one shard group holds.
#include <doctest/doctest.h>

#include <string>

#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/phantom_run.hpp"
#include "../../bench/seed_scenario.hpp"

using namespace zshard;
using namespace zshard::plan;
using namespace zshard_bench;

namespace {

// A small Llama at DeepSpeed's hook granularity, each block a checkpointed segment, 2 micro-batches.
struct small_case {
  transformer_model model = build_transformer_hooks({"small", 3, 256, 688, 4, 2, 1000, true});
  step_program program =
      transformer_hook_program(model, {.micro_batch = 1, .seq_len = 64, .checkpoint = true, .micro_batches = 2});
  engine_config config(int group) const {
    engine_config c;
    c.param_dtype = dtype::bf16;
    c.partition.persistence_threshold_numel = 300;  // norm gains replicated: all-reduced, not scattered
    c.reduce.reduce_bucket_numel = 200'000;
    c.hybrid.shard_group_size = group;
    return c;
  }
};

}  // namespace

TEST_CASE("hybrid plan: bounds the phantom run and counts its bytes in the group and across groups") {
  const small_case sc;
  struct shape {
    int world, group;
  };
  for (const shape sh : {shape{16, 0}, shape{16, 8}, shape{16, 4}, shape{8, 2}, shape{6, 3}}) {
    for (bool host : {false, true}) {
      INFO("world " << sh.world << ", shard group " << sh.group << (host ? ", host optimizer" : ""));
      const auto cfg = sc.config(sh.group);
      const plan_options opt{.optimizer = host ? optimizer_location::host : optimizer_location::device,
                             .initialization = false};
      const memory_plan plan = plan_memory(sc.model.spec, cfg, sh.world, sc.program, opt);
      const phantom_result run =
          host ? run_phantom<seed_policies>(sc.model.spec, cfg, sh.world, training_schedule{{sc.program}}, 3)
               : run_phantom(sc.model.spec, cfg, sh.world, training_schedule{{sc.program}}, 3);
      for (std::size_t c = 0; c < mem_category_count; ++c)
        CHECK(run.peak_step().peak(mem_category(c)) <= plan.device.peak[c]);
      CHECK(run.peak() <= plan.device.total_peak);
      CHECK(plan.shard_group == (sh.group == 0 ? sh.world : sh.group));
      CHECK(plan.traffic.total() == run.bytes_sent_per_step);
      CHECK(plan.traffic.across_groups == run.across_groups_bytes_per_step);
      if (sh.group != 0) {
        CHECK(plan.traffic.shard_group == run.shard_group_bytes_per_step);
        CHECK(plan.traffic.world == run.world_bytes_per_step);
        CHECK(plan.traffic.across_groups > 0);
      } else {
        CHECK(plan.traffic.across_groups == 0);
      }
    }
  }
}

TEST_CASE("hybrid plan: a rank holds a shard group's share; only gradients cross groups") {
  const small_case sc;
  const plan_options opt{.initialization = false};
  const memory_plan hybrid = plan_memory(sc.model.spec, sc.config(4), 16, sc.program, opt);  // 4 x 4
  const memory_plan zero3_group = plan_memory(sc.model.spec, sc.config(0), 4, sc.program, opt);
  const memory_plan zero3_world = plan_memory(sc.model.spec, sc.config(0), 16, sc.program, opt);
  for (auto c : {mem_category::sharded_params, mem_category::optimizer_state, mem_category::grad_shards,
                 mem_category::gathered_params, mem_category::grad_buckets})
    CHECK(hybrid.device.peak_of(c) == zero3_group.device.peak_of(c));
  CHECK(hybrid.device.peak_of(mem_category::sharded_params) > zero3_world.device.peak_of(mem_category::sharded_params));
  // ZeRO-3 on 16 ranks sends everything over the world; hybrid sends gradient shards across
  // groups (an all-reduce of 1/4 of each gradient over 4 replicas) and gathers inside its group.
  CHECK(hybrid.traffic.across_groups < zero3_world.traffic.total() / 4);
  CHECK(hybrid.traffic.shard_group < zero3_world.traffic.total());
}

TEST_CASE("hybrid plan: a bad layout is refused as the engine refuses it") {
  const small_case sc;
  CHECK_THROWS_WITH_AS(plan_memory(sc.model.spec, sc.config(3), 8, sc.program),
                       doctest::Contains("does not divide the world of 8 ranks"), zshard::error);
}

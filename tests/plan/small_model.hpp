#pragma once
// The small model the schedule and offload plan tests walk and run: embed (tied with head), two
// blocks of two modules each under a parent with its norm, a frozen head norm; and its config.
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/schedule.hpp"
#include "zshard/plan/schedule_builder.hpp"

namespace plan_test {

struct small_model {
  zshard::model_spec spec;
  zshard::module_id embed, head, blocks[2], attn[2], mlp[2];
  small_model() {
    using zshard::param_id;
    const param_id e = spec.add_param("embed.w", {50, 24});
    embed = spec.add_module("embed", {e});
    for (int b = 0; b < 2; ++b) {
      const std::string n = "block" + std::to_string(b);
      const param_id norm = spec.add_param(n + ".norm", {24}, {.decay = false});
      const param_id q = spec.add_param(n + ".q", {24, 24}), o = spec.add_param(n + ".o", {24, 24});
      const param_id up = spec.add_param(n + ".up", {24, 64}, {.type = zshard::dtype::f32});
      const param_id down = spec.add_param(n + ".down", {64, 24});
      blocks[b] = spec.add_module(n, {norm});
      attn[b] = spec.add_module(n + ".attn", {q, o});
      mlp[b] = spec.add_module(n + ".mlp", {up, down});
    }
    const param_id hn = spec.add_param("head.norm", {24}, {.trainable = false, .decay = false});
    head = spec.add_module("head", {hn, e});  // tied
  }
  // block 1 used twice per micro-batch (a shared layer), each block a checkpointed segment
  // nested in its parent scope.
  std::vector<zshard::plan::segment> segments() const {
    std::vector<zshard::plan::segment> s{{{embed}, 800, 0, false, {}}};
    for (int b : {0, 1, 1}) s.push_back({{attn[b], mlp[b]}, 400, 3000, true, blocks[b]});
    s.push_back({{head}, 2000, 0, false, {}});
    return s;
  }
  // `micro_batches` micro-batches, then a no-grad evaluation pass, a gather_param and an export.
  zshard::plan::step_program train_and_eval(int micro_batches) const {
    zshard::plan::program_builder step("train+eval");
    for (int i = 0; i < micro_batches; ++i) step.micro_batch(segments());
    step.no_grad_pass({embed, attn[0], mlp[0], attn[1], mlp[1], head}, 5000).gather_param(0).export_params();
    return step.build();
  }
  // Two training steps, then one with the evaluation.
  zshard::plan::training_schedule with_eval(int micro_batches) const {
    const zshard::plan::step_program train = zshard::plan::training_step(segments(), micro_batches, "train");
    return zshard::plan::training_schedule{{train, train, train_and_eval(micro_batches)}};
  }
};

// bf16, small buckets and prefetch sizes, so that every mechanism acts on this model.
inline zshard::engine_config small_config(std::size_t max_live) {
  zshard::engine_config cfg;
  cfg.param_dtype = zshard::dtype::bf16;
  cfg.partition.persistence_threshold_numel = 24;
  cfg.prefetch.prefetch_numel = 2500;
  cfg.prefetch.max_live_numel = max_live;
  cfg.prefetch.max_reuse_distance = 600;
  cfg.reduce.reduce_bucket_numel = 1500;
  cfg.log = [](const std::string&) {};
  return cfg;
}

}  // namespace plan_test

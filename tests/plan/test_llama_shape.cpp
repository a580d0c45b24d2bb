// plan/llama_shape.hpp as a user meets it (README, "Plan a Llama-shaped model"): a shape becomes
// a model_spec at two granularities, a step with the documented activation model, and a plan.
// The references are the closed forms the header documents, written out here again.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../support/error_capture.hpp"
#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/memory_plan.hpp"

using namespace zshard;
using namespace zshard::plan;
using test_support::message_of;

namespace {

// Small enough to plan in milliseconds; grouped-query attention (kv_heads < heads) and a
// vocabulary that is not the hidden size, so that every term of the shape shows.
transformer_shape small(bool tied) { return {"small", 3, 64, 160, 4, 2, 96, tied}; }

}  // namespace

TEST_CASE("llama shapes: the README's lines plan a Llama-shaped model") {
  // README, "Plan a Llama-shaped model", line for line (cfg: bf16 parameters).
  transformer_shape shape = *transformer_shape_named("llama3-8b");
  transformer_model model = build_transformer_hooks(shape);
  step_program step = transformer_hook_program(model, {.micro_batch = 1, .seq_len = 4096, .micro_batches = 4});
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
  memory_plan plan = plan_memory(model.spec, cfg, 8, step, {.optimizer = optimizer_location::host});

  CHECK(model.spec.total_numel() == std::size_t(shape.param_count()));
  // bf16 parameters, sharded over 8 ranks: at least an eighth of the model's bytes per rank.
  CHECK(plan.device.peak_of(mem_category::sharded_params) >= std::size_t(shape.param_count()) * 2 / 8);
  CHECK(plan.device.peak_of(mem_category::optimizer_state) == 0);  // on the host
  CHECK(plan.host.peak_of(mem_category::optimizer_state) > 0);
  CHECK(plan.fits(plan.device.total_peak));
}

TEST_CASE("llama shapes: both granularities hold the same parameters, in the same order") {
  for (bool tied : {false, true}) {
    INFO("tied " << tied);
    const transformer_shape s = small(tied);
    const transformer_model blocks = build_transformer(s), hooks = build_transformer_hooks(s);
    CHECK(blocks.spec.modules().size() == std::size_t(s.layers) + 2);
    CHECK(hooks.spec.modules().size() == std::size_t(9 * s.layers) + 2);
    REQUIRE(blocks.spec.params().size() == hooks.spec.params().size());
    // embed, 9 per block, the final norm and (untied) the head's own matrix
    CHECK(blocks.spec.params().size() == std::size_t(1 + 9 * s.layers + 1 + (tied ? 0 : 1)));
    for (std::size_t p = 0; p < blocks.spec.params().size(); ++p) {
      const auto &a = blocks.spec.params()[p], &b = hooks.spec.params()[p];
      CHECK(a.name == b.name);
      CHECK(a.shape == b.shape);
      CHECK(a.decay == b.decay);
      CHECK(a.decay == (a.name.find("norm") == std::string::npos));  // norm gains: no weight decay
    }
    // A block: 2 h·h (q, o) + 2 h·kv (k, v) + 3 h·f (gate, up, down) + 2 h (norms); kv = 2 heads of 16.
    const std::int64_t h = 64, kv = 2 * 16, f = 160;
    CHECK(s.block_numel() == 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h);
    std::size_t block0 = 0;
    for (param_id p : blocks.spec.module(blocks.blocks[0]).params) block0 += blocks.spec.param(p).numel();
    CHECK(block0 == std::size_t(s.block_numel()));
    CHECK(blocks.spec.total_numel() == std::size_t(s.param_count()));
    CHECK(hooks.block_parts.size() == std::size_t(s.layers));
    CHECK(hooks.spec.module(hooks.block_parts[1][2]).name == "block1.k");
    // Tied: the head lists the embedding matrix itself.
    const param_id head_last = hooks.spec.module(hooks.head).params.back();
    CHECK((head_last == hooks.spec.module(hooks.embed).params.front()) == tied);
  }
}

TEST_CASE("llama shapes: the activation model's closed forms, in the schedule and in the plan") {
  const transformer_shape s = small(false);
  const std::size_t b = 2, t = 16, h = 64, V = 96;
  const activation_options o{.micro_batch = 2, .seq_len = 16, .checkpoint = true, .activation_type = dtype::bf16};
  const std::size_t e = 2, hidden = t * b * h * e, layer = 17 * t * b * h * e, head = 2 * hidden + t * b * V * 4;
  CHECK(layer_activation_bytes(s, o) == layer);
  CHECK(layer_activation_bytes(s, {.micro_batch = 2, .seq_len = 16, .activation_type = dtype::f32}) == 2 * layer);

  const transformer_model blocks = build_transformer(s);
  const step_schedule sched = transformer_schedule(blocks, o);
  REQUIRE(sched.modules.size() == 5);
  CHECK(sched.modules[0].kept_bytes == t * b * 4);  // the token ids
  for (int l = 1; l <= 3; ++l) {
    CHECK(sched.modules[l].kept_bytes == hidden);  // a checkpointed layer keeps its input
    CHECK(sched.modules[l].recompute_bytes == layer - hidden);
    CHECK(sched.modules[l].recomputed);
  }
  CHECK(sched.modules[4].kept_bytes == head);
  const step_schedule plain = transformer_schedule(blocks, {.micro_batch = 2, .seq_len = 16, .checkpoint = false});
  CHECK(plain.modules[2].kept_bytes == layer);
  CHECK_FALSE(plain.modules[2].recomputed);

  // Both granularities plan the same activation peak: every layer's input and the token ids,
  // and then the larger of the head's terms and one layer re-materialised.
  const std::size_t peak = t * b * 4 + 3 * hidden + std::max(head, layer - hidden);
  const memory_plan by_block = plan_memory(blocks.spec, engine_config{}, 2, sched);
  const transformer_model hooks = build_transformer_hooks(s);
  const memory_plan by_hook = plan_memory(hooks.spec, engine_config{}, 2, transformer_hook_program(hooks, o));
  CHECK(by_block.device.peak_of(mem_category::activations) == peak);
  CHECK(by_hook.device.peak_of(mem_category::activations) == peak);
}

TEST_CASE("llama shapes: bad shapes and mismatched calls are refused, naming the shape") {
  transformer_shape s = small(false);
  s.heads = 5;  // 64 is not a multiple of 5
  const std::string heads = message_of([&] { build_transformer(s); });
  CHECK(heads.find("transformer shape 'small'") != std::string::npos);
  CHECK(heads.find("hidden must be a multiple of heads") != std::string::npos);
  s = small(false);
  s.kv_heads = 3;
  CHECK(message_of([&] { build_transformer_hooks(s); }).find("heads must be a multiple of kv_heads") !=
        std::string::npos);
  s = small(false);
  s.layers = 0;
  CHECK(message_of([&] { build_transformer(s); }).find("must be positive") != std::string::npos);
  // A hook program needs the hook-granularity model.
  CHECK(message_of([&] {
          transformer_hook_program(build_transformer(small(false)), {});
        }).find("needs a model from build_transformer_hooks") != std::string::npos);
  CHECK(message_of([&] {
          transformer_schedule(build_transformer(small(false)), {.seq_len = 0});
        }).find("must be positive") != std::string::npos);
  CHECK_FALSE(transformer_shape_named("llama2-7b").has_value());
}

// The DeepSpeed JSON that zshard_plan --fit --write-deepspeed-config writes
// (config/deepspeed_writer.hpp) reads back, through read_deepspeed_config, to the same options:
// every key it writes maps, nothing is unknown or "auto", and the batch keys agree with the run.
// And the C++ text of an engine_config (config/config_cpp.hpp) names what differs from the defaults.
#include <doctest/doctest.h>

#include <string>

#include "zshard/config/config_cpp.hpp"
#include "zshard/config/deepspeed_config.hpp"
#include "zshard/config/deepspeed_writer.hpp"
#include "zshard/plan/fit_search.hpp"

using namespace zshard;

namespace {

// The options DeepSpeed has keys for, compared one by one (what the writer promises).
void check_written_options(const engine_config& a, const engine_config& b) {
  CHECK(a.param_dtype == b.param_dtype);
  CHECK(a.partition.persistence_threshold_numel == b.partition.persistence_threshold_numel);
  CHECK(a.hybrid.shard_group_size == b.hybrid.shard_group_size);
  CHECK(a.prefetch.max_live_numel == b.prefetch.max_live_numel);
  CHECK(a.prefetch.prefetch_numel == b.prefetch.prefetch_numel);
  CHECK(a.prefetch.max_reuse_distance == b.prefetch.max_reuse_distance);
  CHECK(a.reduce.reduce_bucket_numel == b.reduce.reduce_bucket_numel);
  CHECK(a.overlap == b.overlap);
  CHECK(a.clip_norm == b.clip_norm);
  CHECK(a.adamw.lr == b.adamw.lr);
  CHECK(a.adamw.beta1 == b.adamw.beta1);
  CHECK(a.adamw.beta2 == b.adamw.beta2);
  CHECK(a.adamw.eps == b.adamw.eps);
  CHECK(a.adamw.weight_decay == b.adamw.weight_decay);
  CHECK(a.offload.params == b.offload.params);
  CHECK(a.offload.optimizer_state == b.offload.optimizer_state);
  CHECK(a.offload.pin_memory == b.offload.pin_memory);
  if (a.offload.optimizer_state == offload_tier::nvme) {
    CHECK(a.offload.nvme_path == b.offload.nvme_path);
    CHECK(a.offload.nvme_buffer_count == b.offload.nvme_buffer_count);
    CHECK(a.offload.nvme_io_threads == b.offload.nvme_io_threads);
  }
  if (a.param_dtype == dtype::f16) {
    CHECK(b.loss_scale.enabled);
    CHECK(a.loss_scale.initial_scale == b.loss_scale.initial_scale);
    CHECK(a.loss_scale.growth_interval == b.loss_scale.growth_interval);
    CHECK(a.loss_scale.min_scale == b.loss_scale.min_scale);
  }
}

config::deepspeed_settings written_round_trip(const engine_config& c, const config::deepspeed_run& run) {
  const std::string text = config::write_deepspeed_config(c, run);
  INFO(text);
  config::deepspeed_settings ds = config::parse_deepspeed_config(text, {}, "written");
  for (const auto& m : ds.messages()) INFO(m);
  CHECK(ds.messages().empty());  // no unknown key, no "auto", no key without a counterpart
  check_written_options(c, ds.engine);
  CHECK(ds.offload_optimizer == run.offload_optimizer);
  CHECK(ds.offload_param == (c.offload.params == offload_tier::host));
  CHECK(ds.gradient_accumulation_steps == run.gradient_accumulation_steps);
  REQUIRE(ds.micro_batch_size);
  CHECK(*ds.micro_batch_size == run.micro_batch_size);
  CHECK_NOTHROW(ds.check_batch_size(run.world, run.micro_batch_size, run.gradient_accumulation_steps));
  CHECK_THROWS(ds.check_batch_size(run.world + 1, run.micro_batch_size, run.gradient_accumulation_steps));
  return ds;
}

}  // namespace

TEST_CASE("deepspeed writer: what it writes reads back to the same options") {
  engine_config bf16;
  bf16.param_dtype = dtype::bf16;
  bf16.partition.persistence_threshold_numel = 100'000;
  bf16.prefetch = {.max_live_numel = 1'050'673'152, .prefetch_numel = 234'881'024, .max_reuse_distance = 7};
  bf16.reduce.reduce_bucket_numel = 234'881'024;
  bf16.adamw = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  bf16.clip_norm = 1.0;
  written_round_trip(bf16, {.world = 8, .micro_batch_size = 2, .gradient_accumulation_steps = 16, .offload_optimizer = false});

  engine_config host = bf16;
  host.offload.params = offload_tier::host;
  host.offload.pin_memory = false;
  host.hybrid.shard_group_size = 8;
  host.overlap = false;
  written_round_trip(host, {.world = 64, .micro_batch_size = 1, .gradient_accumulation_steps = 4, .offload_optimizer = true});

  engine_config nvme = bf16;
  nvme.offload.optimizer_state = offload_tier::nvme;
  nvme.offload.nvme_path = "/local_nvme/zshard";
  nvme.offload.nvme_buffer_count = 5;
  nvme.offload.nvme_io_threads = 3;
  written_round_trip(nvme, {.world = 8, .micro_batch_size = 1, .gradient_accumulation_steps = 32, .offload_optimizer = true});

  engine_config f16;
  f16.param_dtype = dtype::f16;
  f16.loss_scale = {.enabled = true, .initial_scale = 4096.f, .growth_interval = 500, .min_scale = 0.5f};
  f16.adamw.lr = 3e-3f;
  written_round_trip(f16, {.world = 4, .micro_batch_size = 8, .gradient_accumulation_steps = 1, .offload_optimizer = false});

  engine_config f32;  // f32: "bf16": {"enabled": false}
  f32.partition.persistence_threshold_numel = 1024;
  f32.reduce.reduce_bucket_numel = 1 << 16;
  written_round_trip(f32, {.world = 2, .micro_batch_size = 8, .gradient_accumulation_steps = 2, .offload_optimizer = false});
}

TEST_CASE("deepspeed writer: refuses what DeepSpeed's keys cannot say") {
  engine_config c;
  c.offload.params = offload_tier::host;  // without the host optimizer
  CHECK_THROWS_AS(config::write_deepspeed_config(c, {}), error);
  engine_config odd;
  odd.param_dtype = dtype::f16;
  odd.loss_scale.initial_scale = 1000.f;  // not a power of two: no initial_scale_power says it
  CHECK_THROWS_AS(config::write_deepspeed_config(odd, {}), error);
}

TEST_CASE("deepspeed writer: the fit's choice for Llama-3-70B on 8 x 80 GB reads back") {
  plan::fit_problem pr;
  pr.model = plan::llama_fit_model(plan::llama3_70b(), 4096, dtype::bf16);
  pr.machine = {*plan::gpu_kind_named("a100-80g"), 8, 1};
  pr.global_batch_tokens = 8 * 16 * 4096;
  pr.base.param_dtype = dtype::bf16;
  pr.base.partition.persistence_threshold_numel = 100'000;
  pr.threads = 1;
  const plan::fit_result r = plan::fit_search(pr);
  const plan::fit_entry* best = r.best();
  REQUIRE(best);
  const engine_config cfg = plan::config_of(best->candidate, pr.base, pr.machine, pr.nvme_path);
  CHECK_FALSE(cfg.prefetch.allow_oversized_module);  // DeepSpeed has no key for it: the fit never needs it
  written_round_trip(cfg, {.world = 8,
                   .micro_batch_size = best->candidate.step.micro_batch,
                   .gradient_accumulation_steps = best->candidate.step.accumulation,
                   .offload_optimizer = best->candidate.family.optimizer != plan::fit_optimizer::device});
}

TEST_CASE("engine_config as C++: the members that differ from the defaults, in declaration order") {
  engine_config c;
  CHECK(config::engine_config_cpp(c) == "zshard::engine_config cfg{\n};\n");
  c.param_dtype = dtype::bf16;
  c.prefetch.prefetch_numel = 0;
  c.reduce.reduce_bucket_numel = 65536;
  c.adamw.lr = 3e-4f;
  c.offload.params = offload_tier::host;
  c.offload.nvme_path = "/nvme \"a\"";
  const std::string text = config::engine_config_cpp(c, "x", "  ");
  CHECK(text ==
        "  zshard::engine_config x{\n"
        "      .param_dtype = zshard::dtype::bf16,\n"
        "      .prefetch = {.prefetch_numel = 0},\n"
        "      .reduce = {.reduce_bucket_numel = 65536},\n"
        "      .adamw = {.lr = 3e-04f},\n"
        "      .offload = {.params = zshard::offload_tier::host, .nvme_path = \"/nvme \\\"a\\\"\"},\n"
        "  };\n");
}

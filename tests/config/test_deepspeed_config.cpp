// DeepSpeed JSON import: a real 70B SFT config (ZeRO-3, optimizer offloaded to the CPU, HF
// Trainer "auto"s) maps to the zshard config its user expects; every bad input is an error that
// names its key; unknown keys are listed once each.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "../support/error_capture.hpp"
#include "zshard/config/deepspeed_config.hpp"

using namespace zshard;
using zshard::config::parse_deepspeed_config;

namespace {

const std::string sample_path = std::string(ZSHARD_TEST_DATA_DIR) + "/ds_70b_sft_zero3_offload.json";

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

// The error a config text gives (config kind), as its message.
std::string config_error(const std::string& text) {
  try {
    parse_deepspeed_config(text, {}, "test.json");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::config);
    return e.what();
  }
  FAIL("no error for: " << text);
  return {};
}

std::string zero(const std::string& body) { return R"({"zero_optimization": {"stage": 3, )" + body + "}}"; }

}  // namespace

TEST_CASE("a 70B SFT ZeRO-3 + optimizer-offload config maps to the expected zshard config") {
  const auto ds = config::read_deepspeed_config(sample_path, {.hidden_size = 8192});
  const engine_config& c = ds.engine;
  CHECK(c.param_dtype == dtype::bf16);
  CHECK_FALSE(c.loss_scale.enabled);  // bf16 needs none
  CHECK(c.adamw.lr == doctest::Approx(1e-5));
  CHECK(c.adamw.beta1 == doctest::Approx(0.9));
  CHECK(c.adamw.beta2 == doctest::Approx(0.95));
  CHECK(c.adamw.eps == doctest::Approx(1e-8));
  CHECK(c.adamw.weight_decay == doctest::Approx(0.1));
  CHECK(c.clip_norm == 1.0);
  CHECK(c.overlap);
  CHECK(c.prefetch.max_live_numel == 1'000'000'000);
  CHECK(c.prefetch.max_reuse_distance == 1'000'000'000);
  // "auto" with hidden_size 8192: the Trainer's rules
  CHECK(c.reduce.reduce_bucket_numel == 8192ull * 8192);
  CHECK(c.prefetch.prefetch_numel == std::size_t(0.9 * 8192.0 * 8192.0));
  CHECK(c.partition.persistence_threshold_numel == 81920);
  CHECK(ds.offload_optimizer);
  CHECK(ds.pin_memory);
  CHECK(ds.gradient_accumulation_steps == 16);
  CHECK(ds.micro_batch_size == 1);
  CHECK(ds.unknown_keys.empty());
  // every "auto" and every key without a counterpart is explained by name
  CHECK(mentions(ds.notes, "zero_optimization.reduce_bucket_size is \"auto\""));
  CHECK(mentions(ds.notes, "zero_optimization.stage3_prefetch_bucket_size is \"auto\""));
  CHECK(mentions(ds.notes, "zero_optimization.stage3_param_persistence_threshold is \"auto\""));
  CHECK(mentions(ds.notes, "scheduler: no counterpart"));
  CHECK(mentions(ds.notes, "train_batch_size is \"auto\""));
  CHECK_FALSE(ds.train_batch_size);
  // which values the file set (a loop's own options say which they replace)
  CHECK(ds.sets("optimizer.params.lr"));
  CHECK(ds.sets("gradient_clipping"));
  CHECK(ds.sets("bf16.enabled"));
  CHECK(ds.sets("zero_optimization.reduce_bucket_size"));  // "auto" resolved by the Trainer's rule
  CHECK_FALSE(ds.sets("train_batch_size"));                // "auto"
  CHECK_FALSE(ds.sets("fp16.enabled"));                    // absent
  CHECK(mentions(ds.notes, "zero_optimization.sub_group_size: no counterpart"));
  CHECK_NOTHROW(c.validate());
}

TEST_CASE("without a hidden size, \"auto\" sizes keep zshard's defaults and say so") {
  const auto ds = config::read_deepspeed_config(sample_path);
  const engine_config defaults;
  CHECK(ds.engine.reduce.reduce_bucket_numel == defaults.reduce.reduce_bucket_numel);
  CHECK(ds.engine.prefetch.prefetch_numel == defaults.prefetch.prefetch_numel);
  CHECK(ds.engine.partition.persistence_threshold_numel == defaults.partition.persistence_threshold_numel);
  CHECK(mentions(ds.notes, "keeps zshard's default 500000000 (give import_options::hidden_size"));
  const auto lr_auto = parse_deepspeed_config(R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})");
  CHECK(lr_auto.engine.adamw.lr == defaults.adamw.lr);
  CHECK(mentions(lr_auto.notes, "optimizer.params.lr is \"auto\""));
  CHECK(mentions(lr_auto.notes, "engine::set_lr"));
}

TEST_CASE("unknown keys are reported once each, by their dotted name") {
  const auto ds = parse_deepspeed_config(
      R"({"zero_optimization": {"stage": 3, "stage3_magic": 1, "offload_optimizer": {"device": "cpu", "turbo": true}},
          "my_own_key": {"a": 1}, "fp16": {"enabled": false, "mystery": 2}})");
  CHECK(ds.unknown_keys == std::vector<std::string>{"zero_optimization.stage3_magic",
                                                    "zero_optimization.offload_optimizer.turbo", "my_own_key",
                                                    "fp16.mystery"});
  const auto lines = ds.messages();
  CHECK(std::count_if(lines.begin(), lines.end(),
                      [](const std::string& l) { return l.find("'my_own_key'") != std::string::npos; }) == 1);
  CHECK(ds.engine.param_dtype == dtype::f32);  // fp16 present but disabled
}

TEST_CASE("fp16 maps to f16 with dynamic or static loss scaling") {
  const auto dyn = parse_deepspeed_config(
      R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500,
                   "hysteresis": 2, "min_loss_scale": 2}})");
  CHECK(dyn.engine.param_dtype == dtype::f16);
  CHECK(dyn.engine.loss_scale.enabled);
  CHECK(dyn.engine.loss_scale.initial_scale == 4096.0f);
  CHECK(dyn.engine.loss_scale.growth_interval == 500);
  CHECK(dyn.engine.loss_scale.min_scale == 2.0f);
  CHECK(mentions(dyn.notes, "fp16.hysteresis: no counterpart"));
  const auto fixed = parse_deepspeed_config(R"({"fp16": {"enabled": true, "loss_scale": 128}})");
  CHECK(fixed.engine.loss_scale.initial_scale == 128.0f);
  CHECK(fixed.engine.loss_scale.min_scale == 128.0f);  // never backs off below: static
  CHECK(mentions(fixed.notes, "static scale"));
}

TEST_CASE("each bad input is an error that names its key") {
  struct bad {
    std::string text, names;
  };
  const bad cases[] = {
      {zero(R"("reduce_bucket_size": "500MB")"), "zero_optimization.reduce_bucket_size must be a whole number"},
      {zero(R"("reduce_bucket_size": -5)"), "zero_optimization.reduce_bucket_size = -5 is out of range"},
      {zero(R"("reduce_bucket_size": 0)"), "zero_optimization.reduce_bucket_size = 0 is out of range"},
      {zero(R"("stage3_max_live_parameters": 0)"), "stage3_max_live_parameters = 0 is out of range"},
      {zero(R"("stage3_prefetch_bucket_size": 12.5)"), "stage3_prefetch_bucket_size = 12.5 is not a whole number"},
      {zero(R"("stage3_param_persistence_threshold": true)"), "stage3_param_persistence_threshold must be a whole"},
      {zero(R"("overlap_comm": 1)"), "zero_optimization.overlap_comm must be true or false"},
      {zero(R"("offload_optimizer": {"device": "nvme"})"), "offload_optimizer.device is \"nvme\""},
      {zero(R"("offload_optimizer": {"device": "gpu"})"), "offload_optimizer.device is \"gpu\""},
      {zero(R"("offload_optimizer": "cpu")"), "zero_optimization.offload_optimizer must be a JSON object"},
      {zero(R"("offload_param": {"device": "cpu"})"), "offload_param.device is \"cpu\""},
      {R"({"zero_optimization": {"stage": 2}})", "zero_optimization.stage is 2, zshard implements stage 3 only"},
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage = 4 is out of range"},
      {R"({"gradient_clipping": -1})", "gradient_clipping = -1 is out of range"},
      {R"({"gradient_clipping": "1.0"})", "gradient_clipping must be a norm"},
      {R"({"gradient_accumulation_steps": 0})", "gradient_accumulation_steps = 0 is out of range"},
      {R"({"train_micro_batch_size_per_gpu": [1]})", "train_micro_batch_size_per_gpu must be a whole number"},
      {R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})", "bf16.enabled and fp16.enabled are both true"},
      {R"({"bf16": {"enabled": "yes"}})", "bf16.enabled must be true or false"},
      {R"({"fp16": {"enabled": true, "min_loss_scale": 0}})", "fp16.min_loss_scale is 0"},
      {R"({"fp16": {"enabled": true, "initial_scale_power": 200}})", "fp16.initial_scale_power = 200 is out of range"},
      {R"({"optimizer": {"type": "SGD"}})", "optimizer.type is \"SGD\""},
      {R"({"optimizer": {"params": {"lr": 0}}})", "optimizer.params.lr = 0 is out of range"},
      {R"({"optimizer": {"params": {"betas": [0.9]}}})", "optimizer.params.betas must be a list of two numbers"},
      {R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})", "optimizer.params.betas[1] = 1.0 is out of range"},
      {R"({"optimizer": {"params": {"weight_decay": -0.1}}})", "optimizer.params.weight_decay = -0.1 is out of range"},
      {R"([1, 2])", "the top level must be a JSON object"},
      {R"({"zero_optimization": {"stage": 3,}})", "not valid JSON"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const std::string what = config_error(c.text);
    CHECK_MESSAGE(what.find(c.names) != std::string::npos, what);
    CHECK(what.find("test.json") != std::string::npos);  // the source is named too
  }
}

TEST_CASE("a missing file is an i/o error naming the path") {
  const auto read = [] { config::read_deepspeed_config("/nonexistent/ds.json"); };
  CHECK(test_support::kind_of(read) == error_kind::io);
  CHECK(test_support::message_of(read).find("/nonexistent/ds.json") != std::string::npos);
}

TEST_CASE("MiCS's mics_shard_size maps to hybrid sharding's shard group size") {
  CHECK(parse_deepspeed_config(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})").engine.hybrid.shard_group_size ==
        8);
  CHECK(parse_deepspeed_config(R"({"zero_optimization": {"stage": 3, "mics_shard_size": -1}})").engine.hybrid.shard_group_size ==
        0);
  CHECK_THROWS_WITH_AS(parse_deepspeed_config(R"({"zero_optimization": {"mics_shard_size": 0}})"),
                       doctest::Contains("zero_optimization.mics_shard_size"), zshard::error);
}

TEST_CASE("ZeRO-Infinity offload keys map to the tiers: parameters on the host, optimizer state on NVMe") {
  const auto ds = parse_deepspeed_config(zero(R"(
      "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6, "pin_memory": true,
                            "pipeline_read": true, "pipeline_write": true})"));
  CHECK(ds.offload_optimizer);
  CHECK(ds.offload_param);
  CHECK(ds.pin_memory);
  CHECK(ds.engine.offload.params == offload_tier::host);
  CHECK(ds.engine.offload.optimizer_state == offload_tier::nvme);
  CHECK(ds.engine.offload.nvme_path == "/local_nvme");
  CHECK(ds.engine.offload.nvme_buffer_count == 6);
  CHECK(ds.engine.offload.pin_memory);
  CHECK(mentions(ds.notes, "offload_param.buffer_count: no counterpart"));
  CHECK(mentions(ds.notes, "offload_optimizer.pipeline_read: no counterpart"));
  CHECK(ds.unknown_keys.empty());
  // pageable host memory, DeepSpeed's aio threads, the optimizer in host memory
  const auto cpu = parse_deepspeed_config(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "pin_memory": false}, "offload_param": {"device": "none"}},
      "aio": {"thread_count": 3, "block_size": 1048576, "queue_depth": 8}})");
  CHECK(cpu.offload_optimizer);
  CHECK(!cpu.offload_param);
  CHECK(!cpu.engine.offload.pin_memory);
  CHECK(cpu.engine.offload.optimizer_state == offload_tier::host);
  CHECK(cpu.engine.offload.params == offload_tier::device);
  CHECK(cpu.engine.offload.nvme_io_threads == 3);
  CHECK(mentions(cpu.notes, "aio.queue_depth: no counterpart"));
}

TEST_CASE("offload settings zshard cannot honour are refused by name") {
  struct bad {
    std::string text, names;
  };
  const bad cases[] = {
      {zero(R"("offload_param": {"device": "nvme", "nvme_path": "/nvme"}, "offload_optimizer": {"device": "cpu"})"),
       "zero_optimization.offload_param.device is \"nvme\": zshard keeps offloaded parameter shards in host memory"},
      {zero(R"("offload_param": {"device": "cpu"})"),
       "zero_optimization.offload_param.device is \"cpu\" while offload_optimizer.device is not"},
      {zero(R"("offload_optimizer": {"device": "nvme"})"),
       "zero_optimization.offload_optimizer.nvme_path is missing, and offload_optimizer.device is \"nvme\""},
      {zero(R"("offload_optimizer": {"device": "nvme", "nvme_path": "/n", "buffer_count": 2})"),
       "zero_optimization.offload_optimizer.buffer_count = 2 is out of range"},
      {zero(R"("offload_optimizer": {"device": "cpu", "pin_memory": true},
               "offload_param": {"device": "cpu", "pin_memory": false})"),
       "offload_param.pin_memory = false differs from zero_optimization.offload_optimizer.pin_memory"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const std::string what = config_error(c.text);
    CHECK_MESSAGE(what.find(c.names) != std::string::npos, what);
  }
}

TEST_CASE("train_batch_size is checked against ranks x micro-batch x accumulation, naming every number") {
  const auto ds = parse_deepspeed_config(
      R"({"zero_optimization": {"stage": 3}, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})",
      {}, "ds.json");
  REQUIRE(ds.train_batch_size == 32);
  CHECK(ds.sets("train_batch_size"));
  CHECK_NOTHROW(ds.check_batch_size(4, 4, 2));
  CHECK(test_support::kind_of([&] { ds.check_batch_size(2, 4, 2); }) == error_kind::config);
  const std::string e = test_support::message_of([&] { ds.check_batch_size(2, 4, 2); });
  CHECK(e.find("ds.json: train_batch_size = 32 contradicts the run: 2 rank(s) x 4 sequence(s) per micro-batch x 2 "
               "micro-batch(es) per step = 16") != std::string::npos);
  CHECK(e.find("how to fix") != std::string::npos);
  // no train_batch_size: nothing to contradict
  CHECK_NOTHROW(parse_deepspeed_config(R"({"zero_optimization": {"stage": 3}})").check_batch_size(3, 5, 7));
}

TEST_CASE("a config without zero_optimization, or without its stage, says that zshard runs stage 3") {
  const std::string said = "zshard runs ZeRO stage 3";
  CHECK(mentions(parse_deepspeed_config(R"({"gradient_clipping": 1.0})").notes, "no zero_optimization section"));
  CHECK(mentions(parse_deepspeed_config(R"({"gradient_clipping": 1.0})").notes, said));
  CHECK(mentions(parse_deepspeed_config(R"({"zero_optimization": {"overlap_comm": true}})").notes,
                 "zero_optimization has no stage"));
  CHECK_FALSE(mentions(parse_deepspeed_config(R"({"zero_optimization": {"stage": 3}})").notes, said));
}

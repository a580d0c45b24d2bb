// The main job's command line (examples/gpt/train_options.hpp, run_record.hpp): numbers are
// refused naming the flag and the value; explicit options win over a DeepSpeed config and
// each override is said; --bf16 against fp16 is an error; a resumed run says what it keeps,
// what its options change and whether it continues bit for bit; the rows a step trains on
// depend on the global batch only, not on how it is split over ranks and micro-batches.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include "../../examples/gpt/run_record.hpp"
#include "../../examples/gpt/train_options.hpp"

namespace {

gpt::train_options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "02_train_gpt");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return gpt::parse_options(int(argv.size()), argv.data());
}

std::string refusal(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

// A DeepSpeed config in a temporary file.
struct config_file {
  std::string path = (std::filesystem::temp_directory_path() / ("zshard-ds-" + std::to_string(::getpid()) + ".json")).string();
  explicit config_file(const std::string& text) { std::ofstream(path) << text; }
  ~config_file() { std::filesystem::remove(path); }
};

bool has(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("bad numbers are refused naming the flag and the value") {
  CHECK(refusal({"--steps", "abc"}) == "--steps takes a whole number, not 'abc'");
  CHECK(refusal({"--steps", "12x"}) == "--steps takes a whole number, not '12x'");
  CHECK(refusal({"--steps", "0"}) == "--steps must be at least 1, got 0");
  CHECK(refusal({"--ranks", "65"}) == "--ranks must be in [1, 64], got 65");
  CHECK(refusal({"--lr", "fast"}) == "--lr takes a number, not 'fast'");
  CHECK(refusal({"--clip", "-1"}) == "--clip must be at least 0, got -1");
  CHECK(refusal({"--seed", "-3"}) == "--seed must be at least 0, got -3");
  CHECK(refusal({"--eval-every"}) == "missing value after --eval-every");
  CHECK(refusal({"--bogus"}) == "unknown option '--bogus' (try --help)");
  const auto o = parse({"--steps", "7", "--lr", "1e-9", "--bf16"});
  CHECK(o.steps == 7);
  CHECK(o.was_given("--lr"));
  CHECK_FALSE(o.was_given("--clip"));
}

TEST_CASE("explicit options win over a DeepSpeed config, and each override is reported") {
  const config_file f(R"({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
                          "gradient_clipping": 1.0, "gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": 4})");
  SUBCASE("the config alone") {
    auto o = parse({"--deepspeed-config", f.path});
    zshard::engine_config cfg;
    gpt::apply_deepspeed(o.model, cfg, o);
    CHECK(cfg.adamw.lr == 3e-4f);
    CHECK(cfg.clip_norm == 1.0);
    CHECK(cfg.param_dtype == zshard::dtype::f32);
    CHECK(o.micro_batches == 2);
    CHECK(o.batch == 4);
    CHECK(o.lr == 3e-4f);
  }
  SUBCASE("--lr, --bf16, --clip, --micro and --batch on the command line") {
    auto o = parse({"--deepspeed-config", f.path, "--lr", "1e-9", "--bf16", "--clip", "0", "--micro", "3", "--batch", "5"});
    zshard::engine_config cfg;
    gpt::apply_deepspeed(o.model, cfg, o);
    CHECK(cfg.adamw.lr == 1e-9f);
    CHECK(cfg.param_dtype == zshard::dtype::bf16);
    CHECK(cfg.clip_norm == 0.0);
    CHECK(o.micro_batches == 3);
    CHECK(o.batch == 5);
  }
  SUBCASE("--bf16 against fp16.enabled is a conflict") {
    const config_file f16(R"({"zero_optimization": {"stage": 3}, "fp16": {"enabled": true}})");
    auto o = parse({"--deepspeed-config", f16.path, "--bf16"});
    zshard::engine_config cfg;
    CHECK_THROWS_WITH_AS(gpt::apply_deepspeed(o.model, cfg, o),
                         doctest::Contains(("--bf16 conflicts with " + f16.path + "'s fp16.enabled = true").c_str()),
                         std::invalid_argument);
  }
}

TEST_CASE("a resumed run says what it keeps, what its options change, and whether it is bit for bit") {
  auto o = parse({"--ranks", "4", "--batch", "2"});
  const gpt::run_record saved = gpt::run_record::of(o, 6, 4, zshard::dtype::f32);
  const gpt::run_record back = gpt::run_record::parse(saved.to_text());
  CHECK(back.known);
  CHECK(back.to_text() == saved.to_text());
  CHECK(has(gpt::describe_resume(back, saved, 3e-3f, o), "bit for bit as if never stopped"));
  CHECK(has(gpt::describe_resume(back, saved, 3e-3f, o), "learning rate 0.003"));

  auto two = parse({"--ranks", "2", "--batch", "4"});  // the same global batch, split otherwise
  const auto split = gpt::describe_resume(back, gpt::run_record::of(two, 6, 2, zshard::dtype::f32), 3e-3f, two);
  CHECK(has(split, "the same global batches of 8 sequences, split 2 rank(s) x 4 x 1 instead of 4 rank(s) x 2 x 1"));
  CHECK(has(split, "not necessarily bit for bit"));

  auto half = parse({"--ranks", "2", "--lr", "5"});  // global batch 16 and a new learning rate
  const auto changed = gpt::describe_resume(back, gpt::run_record::of(half, 6, 2, zshard::dtype::f32), 3e-3f, half);
  CHECK(has(changed, "--lr 5 replaces the saved learning rate 0.003"));
  CHECK(has(changed, "global batch 16 sequences"));
  CHECK_FALSE(has(changed, "learning rate 0.003,"));
  CHECK_FALSE(has(changed, "bit for bit as if"));

  const gpt::run_record old = gpt::run_record::parse("step 6");  // an older example's user_state
  CHECK_FALSE(old.known);
  CHECK(has(gpt::describe_resume(old, saved, 3e-3f, o), "does not record the options it was saved with"));
}

TEST_CASE("a step's rows depend on the global batch only, however it is split") {
  // (ranks, batch, micro): all 8 sequences per step; each split draws rows [0, 8), once each
  for (const auto& [world, batch, micro] : {std::tuple{4, 2, 1}, std::tuple{2, 4, 1}, std::tuple{2, 2, 2},
                                             std::tuple{1, 8, 1}, std::tuple{1, 1, 8}}) {
    std::multiset<int> rows;
    for (int mb = 0; mb < micro; ++mb)
      for (int r = 0; r < world; ++r)
        for (int k = 0; k < batch; ++k) rows.insert(gpt::first_row(mb, r, world, batch) + k);
    std::multiset<int> want;
    for (int k = 0; k < 8; ++k) want.insert(k);
    CHECK(rows == want);
  }
}

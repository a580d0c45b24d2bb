#pragma once
// The Llama main job's command line (examples/06_train_llama.cpp; scripts/run_example.sh
// --model llama): its options, --help, and parsing that names the flag and the value it
// refuses (the GPT job's whole_number / real_number, gpt/train_options.hpp).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <set>
#include <stdexcept>
#include <string>

#include "../gpt/train_options.hpp"
#include "zshard/core/dtype.hpp"

namespace llama {

struct train_options {
  std::string init_from;  // a Hugging Face checkpoint directory
  std::string config;     // or a config.json, for random weights
  int ranks = 2;
  bool mpi = false;
  int steps = 20;
  int batch = 4;  // sequences per micro-batch per rank
  int micro_batches = 1;
  int seq = 32;
  int prompt_tokens = -1;  // -1: seq / 2
  float lr = 1e-3f;
  float weight_decay = 0.01f;
  double clip = 1.0;
  bool checkpoint = true;
  int eval_every = 0;
  int log_every = 5;
  std::string text;
  std::uint64_t seed = 1234;
  std::string save_dir;
  int save_every = 0;
  std::string resume;
  std::string export_dir;
  std::string export_dtype;  // f32, bf16, f16; empty: the checkpoint's own
  std::uint64_t max_shard_bytes = 5'000'000'000;
  std::string logits_out;
  bool help = false;
  std::set<std::string> given;

  int prompt() const { return prompt_tokens < 0 ? seq / 2 : prompt_tokens; }
  bool was_given(const std::string& flag) const { return given.count(flag) != 0; }
};

inline void print_usage() {
  std::printf(
      "usage: 06_train_llama --init-from DIR [options]   (scripts/run_example.sh --model llama --init-from DIR ...)\n"
      "Fine-tunes a Hugging Face Llama with zshard (ZeRO-3) on thread ranks or MPI processes (host backend), on\n"
      "the main job's data (the synthetic language, or --text FILE as bytes) as a supervised fine-tune: the first\n"
      "--prompt-tokens positions of every sequence are the prompt, their labels -100 (no loss), the rest is trained.\n"
      "  --init-from DIR      a Hugging Face checkpoint directory: config.json and model.safetensors or\n"
      "                       model.safetensors.index.json with its shards (names: README, \"Fine-tune a Hugging\n"
      "                       Face Llama\"); bf16, f16 or f32 weights\n"
      "  --config FILE        instead of --init-from: a Llama config.json, random weights (transformers' init)\n"
      "  --ranks N            thread ranks (default 2)\n"
      "  --mpi                one MPI process per rank (scripts/run_example.sh --model llama --mpi N ...)\n"
      "  --steps N            optimizer steps, counted from 0 also when resuming (default 20)\n"
      "  --batch N            sequences per micro-batch per rank (default 4)\n"
      "  --micro N            micro-batches per step per rank (default 1)\n"
      "  --seq N              tokens per sequence (default 32)\n"
      "  --prompt-tokens N    prompt positions per sequence, labels -100 (default seq / 2; 0: none)\n"
      "  --lr X               AdamW learning rate (default 1e-3)\n"
      "  --weight-decay X     AdamW weight decay of the weights; norm gains get none (default 0.01)\n"
      "  --clip X             global-norm gradient clipping, 0 = off (default 1.0)\n"
      "  --no-checkpoint      keep every block's activations (default: checkpoint each block)\n"
      "  --eval-every N       no-grad evaluation pass every N steps, 0 = never (default 0)\n"
      "  --log-every N        a step line every N steps (default 5)\n"
      "  --text FILE          train on the bytes of FILE (the model's vocab must hold 256 tokens)\n"
      "  --seed N             data seed, and the weights' with --config (default 1234)\n"
      "  --save-dir DIR       zshard checkpoints (sharded, resumable) into DIR after the last step\n"
      "  --save-every K       and every K steps\n"
      "  --resume DIR         continue from DIR's latest zshard checkpoint (with --init-from or --config for the shape)\n"
      "  --export DIR         write the trained model as a Hugging Face checkpoint directory (config.json,\n"
      "                       shards + index): AutoModelForCausalLM.from_pretrained(DIR) loads it; DIR must not\n"
      "                       exist or be empty\n"
      "  --export-dtype T     f32, bf16 or f16 (default: the dtype of --init-from's config.json, else f32)\n"
      "  --max-shard-size S   the largest shard of the export, bytes with KB, MB or GB (1000s) or KiB, MiB or GiB\n"
      "                       (1024s), as save_pretrained's max_shard_size (default 5GB); more shards come with\n"
      "                       model.safetensors.index.json\n"
      "  --logits-out FILE    after training (and --export: on the exported weights, read back), one no-grad pass\n"
      "                       on a held-out batch: its input_ids and logits as a safetensors file\n"
      "                       (tools/hf_reference/check_export.py DIR FILE compares them with transformers')\n"
      "The last line printed is `final_loss: <mean loss of the last step>`. Exit status: 0 trained, 2 bad input or\n"
      "a failure (the message says which).\n");
}

// "64KB", "5GB", "1.5GiB", "100000": a byte count as save_pretrained's max_shard_size reads it.
inline std::uint64_t byte_size(const std::string& flag, const std::string& v) {
  static const std::pair<const char*, double> units[] = {{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                                                         {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},
                                                         {"B", 1.0}};
  std::string number = v;
  double unit = 1.0;
  for (const auto& [suffix, scale] : units) {
    const std::string s = suffix;
    if (v.size() > s.size() && v.compare(v.size() - s.size(), s.size(), s) == 0) {
      number = v.substr(0, v.size() - s.size());
      unit = scale;
      break;
    }
  }
  const std::optional<double> x = zshard::read_number(number);
  if (!x || !(*x * unit >= 1.0) || *x * unit > 1e18)
    throw std::invalid_argument(flag + " takes a size such as 64KB, 500MB or 5GB, not '" + v + "'");
  return std::uint64_t(*x * unit);
}

inline train_options parse_options(int argc, char** argv) {
  train_options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value after ") + argv[i]);
    return argv[++i];
  };
  constexpr long long big = std::numeric_limits<int>::max();
  auto positive = [&](const std::string& flag, int& i) { return int(gpt::whole_number(flag, value(i), 1, big)); };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0) o.given.insert(a);
    if (a == "--help" || a == "-h") o.help = true;
    else if (a == "--init-from") o.init_from = value(i);
    else if (a == "--config") o.config = value(i);
    else if (a == "--ranks") o.ranks = int(gpt::whole_number(a, value(i), 1, 64));
    else if (a == "--mpi") o.mpi = true;
    else if (a == "--steps") o.steps = positive(a, i);
    else if (a == "--batch") o.batch = positive(a, i);
    else if (a == "--micro") o.micro_batches = positive(a, i);
    else if (a == "--seq") o.seq = int(gpt::whole_number(a, value(i), 2, 1 << 20));
    else if (a == "--prompt-tokens") o.prompt_tokens = int(gpt::whole_number(a, value(i), 0, big));
    else if (a == "--lr") o.lr = float(gpt::real_number(a, value(i), 0.0));
    else if (a == "--weight-decay") o.weight_decay = float(gpt::real_number(a, value(i), 0.0));
    else if (a == "--clip") o.clip = gpt::real_number(a, value(i), 0.0);
    else if (a == "--no-checkpoint") o.checkpoint = false;
    else if (a == "--eval-every") o.eval_every = int(gpt::whole_number(a, value(i), 0, big));
    else if (a == "--log-every") o.log_every = positive(a, i);
    else if (a == "--text") o.text = value(i);
    else if (a == "--seed") o.seed = std::uint64_t(gpt::whole_number(a, value(i), 0, std::numeric_limits<long long>::max()));
    else if (a == "--save-dir") o.save_dir = value(i);
    else if (a == "--save-every") o.save_every = positive(a, i);
    else if (a == "--resume") o.resume = value(i);
    else if (a == "--export") o.export_dir = value(i);
    else if (a == "--export-dtype") o.export_dtype = value(i);
    else if (a == "--max-shard-size") o.max_shard_bytes = byte_size(a, value(i));
    else if (a == "--logits-out") o.logits_out = value(i);
    else throw std::invalid_argument("unknown option '" + a + "' (try --help)");
  }
  if (o.help) return o;
  if (o.lr <= 0) throw std::invalid_argument("--lr must be positive");
  if (o.init_from.empty() == o.config.empty())
    throw std::invalid_argument("name the model: --init-from DIR (a Hugging Face checkpoint) or --config FILE "
                                "(random weights), one of them");
  if (o.mpi && o.was_given("--ranks"))
    throw std::invalid_argument("--ranks counts thread ranks; under --mpi the world size is mpirun's -n");
  if (o.prompt() >= o.seq)
    throw std::invalid_argument("--prompt-tokens " + std::to_string(o.prompt()) + " leaves no label in a sequence of " +
                                std::to_string(o.seq) + " (--seq)");
  if (o.save_every > 0 && o.save_dir.empty()) throw std::invalid_argument("--save-every needs --save-dir");
  if (!o.export_dtype.empty() && o.export_dtype != "f32" && o.export_dtype != "bf16" && o.export_dtype != "f16")
    throw std::invalid_argument("--export-dtype takes f32, bf16 or f16, not '" + o.export_dtype + "'");
  std::error_code ec;
  if (!o.export_dir.empty() && std::filesystem::exists(o.export_dir, ec) &&
      (!std::filesystem::is_directory(o.export_dir, ec) || !std::filesystem::is_empty(o.export_dir, ec)))
    throw std::invalid_argument("--export " + o.export_dir +
                                ": exists and is not an empty directory (an export overwrites nothing: name a new one)");
  return o;
}

// The export's dtype: --export-dtype, else the checkpoint's own (config.json's dtype), else f32.
inline zshard::dtype export_dtype(const train_options& o, const std::string& config_dtype) {
  const std::string t = !o.export_dtype.empty() ? o.export_dtype
                        : config_dtype == "bfloat16" ? "bf16"
                        : config_dtype == "float16"  ? "f16"
                                                     : "f32";
  return t == "bf16" ? zshard::dtype::bf16 : t == "f16" ? zshard::dtype::f16 : zshard::dtype::f32;
}

}  // namespace llama

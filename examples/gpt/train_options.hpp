#pragma once
// The main job's command line (examples/02_train_gpt.cpp): its options, --help, parsing that
// names the flag and the value it refuses, and how a DeepSpeed config and the command line
// combine. The rule: the config's values replace the example's defaults; an option given on
// the command line wins over the config, and each value it replaces is said; --bf16 against a
// config that enables fp16 is an error (two working precisions, and the config's loss-scale
// settings would mean nothing).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "gpt_config.hpp"
#include "zshard/config/deepspeed_config.hpp"
#include "zshard/core/read_number.hpp"
#include "zshard/engine/engine_config.hpp"

namespace gpt {

struct train_options {
  int ranks = 4;
  bool mpi = false;          // one MPI process per rank; the world size is mpirun's -n
  int steps = 200;
  int micro_batches = 1;     // per rank, per step (gradient accumulation)
  int batch = 8;             // sequences per micro-batch per rank
  gpt_config model{.vocab = 64, .seq_len = 64, .d_model = 128, .n_heads = 4, .n_layers = 4, .d_ff = 512};
  float lr = 3e-3f;
  double clip = 1.0;
  bool checkpoint = true;    // activation checkpointing per block
  bool bf16 = false;
  int eval_every = 25;
  int log_every = 10;
  std::string text;
  std::uint64_t seed = 1234;
  std::size_t persistence_threshold = 1024;  // biases and layer-norm gains stay replicated
  std::string init_from;    // pretrained weights (.safetensors or .safetensors.index.json)
  std::string save_dir;     // sharded checkpoints go here
  int save_every = 0;       // steps between checkpoints (0: only at the end when --save-dir is given)
  int keep_last = 3;
  std::string resume;       // a checkpoint directory to continue from
  std::string export_path;  // one safetensors file of the trained model
  bool export_bf16 = false;
  bool profile = false;
  std::string deepspeed_config;  // a DeepSpeed JSON config to take sizes and hyper-parameters from
  std::string trace_file;        // Chrome/Perfetto trace of one step
  int trace_step = 3;
  bool help = false;
  std::set<std::string> given;  // the flags on the command line

  bool was_given(const std::string& flag) const { return given.count(flag) != 0; }
  // Sequences per optimizer step over every rank: what the data order depends on.
  long long global_batch(int world) const { return 1LL * world * batch * micro_batches; }
};

// The data order: step s trains on rows [0, world x batch x micro) of data batch s - 1,
// micro-batch mb on rows [mb x world x batch, (mb + 1) x world x batch) and rank r on its
// `batch` rows of those, starting here. So a step's data depend on the global batch only.
inline int first_row(int mb, int rank, int world, int batch) { return (mb * world + rank) * batch; }

inline void print_usage() {
  std::printf(
      "usage: 02_train_gpt [options]\n"
      "  --ranks N          thread ranks (default 4)\n"
      "  --mpi              one MPI process per rank instead of threads: start with\n"
      "                     mpirun -n N 02_train_gpt --mpi (or scripts/run_example.sh --mpi N)\n"
      "  --steps N          optimizer steps (default 200)\n"
      "  --micro N          micro-batches per step per rank, gradient accumulation (default 1)\n"
      "  --batch N          sequences per micro-batch per rank (default 8)\n"
      "                     the global batch is ranks x batch x micro; step s trains on sequences\n"
      "                     [0, global batch) of data batch s, whatever the split over ranks\n"
      "  --seq N            sequence length (default 64)\n"
      "  --layers N         transformer blocks (default 4)\n"
      "  --d-model N        model width (default 128)\n"
      "  --heads N          attention heads (default 4)\n"
      "  --d-ff N           MLP width (default 512)\n"
      "  --lr X             AdamW learning rate (default 3e-3; with --resume: replaces the saved one)\n"
      "  --clip X           global-norm gradient clipping, 0 = off (default 1.0)\n"
      "  --no-checkpoint    keep every block's activations (default: checkpoint each block,\n"
      "                     re-running its forward during backward)\n"
      "  --bf16             bf16 working parameters (fp32 master weights)\n"
      "  --eval-every N     no-grad evaluation pass every N steps, 0 = never (default 25)\n"
      "  --log-every N      print a step line every N steps (default 10)\n"
      "  --text FILE        train on the bytes of FILE instead of the synthetic language\n"
      "  --seed N           initialisation and data seed (default 1234)\n"
      "  --init-from FILE   start from pretrained weights: a .safetensors file as --export writes it\n"
      "                     (torch layout: linear weights (out, in)) or a *.safetensors.index.json\n"
      "  --save-dir DIR     write sharded checkpoints into DIR (atomic; DIR/latest names the newest)\n"
      "  --save-every K     a checkpoint every K steps (default: only after the last step)\n"
      "  --keep-last N      checkpoints kept in DIR (default 3)\n"
      "  --resume DIR       continue from DIR's latest checkpoint (or a step-* directory) at the step\n"
      "                     it holds, keeping its learning rate unless --lr is given; it says which\n"
      "                     saved values it keeps and which options change them. With the same\n"
      "                     --ranks, --batch, --micro, --seed, data, --clip and precision (and no new\n"
      "                     --lr) it continues bit for bit as if never stopped. With another split of\n"
      "                     the same global batch (--ranks 2 --batch 8 after --ranks 4 --batch 4) it\n"
      "                     trains on the same batches, but the gradient sums are grouped\n"
      "                     differently: equal to rounding, not necessarily bit for bit\n"
      "  --export FILE      write the trained model as one safetensors file in torch's layout\n"
      "                     (linear weights (out, in); README: names and GPT-2 mapping)\n"
      "  --export-bf16      export in bf16 (default f32)\n"
      "  --profile          print the share of a step in compute, engine, communication and optimizer\n"
      "  --deepspeed-config FILE  take ZeRO-3 sizes (mics_shard_size: hybrid sharding), precision,\n"
      "                     clipping, AdamW, train_micro_batch_size_per_gpu and\n"
      "                     gradient_accumulation_steps from a DeepSpeed JSON config; options given\n"
      "                     on the command line win and each override is printed; a contradicting\n"
      "                     train_batch_size, or --bf16 against fp16.enabled, is an error\n"
      "  --trace FILE       write a Chrome/Perfetto trace (engine events, each rank's ledger)\n"
      "                     of one step to FILE; tools/plot_memory.py draws it\n"
      "  --trace-step N     the step to trace (default 3: after the prefetch trace is recorded)\n"
      "The last line printed is `final_loss: <mean loss of the last step>`.\n"
      "Exit status: 0 trained; 1 a fresh run (no --resume, no --init-from) whose last loss is not\n"
      "below its first (the job checks that it learns; runs from trained weights only report it);\n"
      "2 bad input or a failure (the message says which).\n");
}

// A whole number for `flag` in [min, max], or an error naming both.
inline long long whole_number(const std::string& flag, const std::string& v, long long min, long long max) {
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) throw std::invalid_argument(flag + " takes a whole number, not '" + v + "'");
  if (n < min || n > max)
    throw std::invalid_argument(flag + " must be " +
                                (max >= std::numeric_limits<int>::max() ? "at least " + std::to_string(min)
                                                                              : "in [" + std::to_string(min) + ", " +
                                                                                    std::to_string(max) + "]") +
                                ", got " + v);
  return n;
}

inline double real_number(const std::string& flag, const std::string& v, double min) {
  const std::optional<double> read = zshard::read_number(v);
  if (!read) throw std::invalid_argument(flag + " takes a number, not '" + v + "'");
  const double x = *read;
  if (x < min) {
    std::ostringstream m;
    m << flag << " must be at least " << min << ", got " << v;
    throw std::invalid_argument(m.str());
  }
  return x;
}

inline train_options parse_options(int argc, char** argv) {
  train_options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value after ") + argv[i]);
    return argv[++i];
  };
  constexpr long long big = std::numeric_limits<int>::max();
  auto positive = [&](const std::string& flag, int& i) { return int(whole_number(flag, value(i), 1, big)); };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0) o.given.insert(a);
    if (a == "--help" || a == "-h") o.help = true;
    else if (a == "--ranks") o.ranks = int(whole_number(a, value(i), 1, 64));
    else if (a == "--mpi") o.mpi = true;
    else if (a == "--steps") o.steps = positive(a, i);
    else if (a == "--micro") o.micro_batches = positive(a, i);
    else if (a == "--batch") o.batch = positive(a, i);
    else if (a == "--seq") o.model.seq_len = positive(a, i);
    else if (a == "--layers") o.model.n_layers = positive(a, i);
    else if (a == "--d-model") o.model.d_model = positive(a, i);
    else if (a == "--heads") o.model.n_heads = positive(a, i);
    else if (a == "--d-ff") o.model.d_ff = positive(a, i);
    else if (a == "--lr") o.lr = float(real_number(a, value(i), 0.0));
    else if (a == "--clip") o.clip = real_number(a, value(i), 0.0);
    else if (a == "--no-checkpoint") o.checkpoint = false;
    else if (a == "--bf16") o.bf16 = true;
    else if (a == "--eval-every") o.eval_every = int(whole_number(a, value(i), 0, big));
    else if (a == "--log-every") o.log_every = positive(a, i);
    else if (a == "--text") o.text = value(i);
    else if (a == "--seed") o.seed = std::uint64_t(whole_number(a, value(i), 0, std::numeric_limits<long long>::max()));
    else if (a == "--init-from") o.init_from = value(i);
    else if (a == "--save-dir") o.save_dir = value(i);
    else if (a == "--save-every") o.save_every = positive(a, i);
    else if (a == "--keep-last") o.keep_last = positive(a, i);
    else if (a == "--resume") o.resume = value(i);
    else if (a == "--export") o.export_path = value(i);
    else if (a == "--export-bf16") o.export_bf16 = true;
    else if (a == "--profile") o.profile = true;
    else if (a == "--deepspeed-config") o.deepspeed_config = value(i);
    else if (a == "--trace") o.trace_file = value(i);
    else if (a == "--trace-step") o.trace_step = positive(a, i);
    else throw std::invalid_argument("unknown option '" + a + "' (try --help)");
  }
  if (o.lr <= 0) throw std::invalid_argument("--lr must be positive");
  if (o.mpi && o.was_given("--ranks"))
    throw std::invalid_argument("--ranks counts thread ranks; under --mpi the world size is mpirun's -n");
  if (!o.resume.empty() && !o.init_from.empty())
    throw std::invalid_argument("--resume and --init-from exclude each other (a checkpoint holds the weights)");
  if (o.save_every > 0 && o.save_dir.empty()) throw std::invalid_argument("--save-every needs --save-dir");
  std::error_code ec;
  if (!o.export_path.empty() && std::filesystem::is_directory(o.export_path, ec))  // said before training, not after
    throw std::invalid_argument("--export " + o.export_path + ": a directory; name the file to write (e.g. " +
                                (std::filesystem::path(o.export_path) / "model.safetensors").string() + ")");
  if (!o.trace_file.empty() && o.trace_step > o.steps)
    throw std::invalid_argument("--trace-step " + std::to_string(o.trace_step) + " is after the last step (--steps " +
                                std::to_string(o.steps) + ")");
  return o;
}

namespace detail {
inline std::string show(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}
}  // namespace detail

// --deepspeed-config: the file's values replace the example's defaults (the ones it does not
// set take zshard's), then every option given on the command line wins, saying which value of
// the file it replaces. Returns what was read (for check_batch_size once the world is known).
inline zshard::config::deepspeed_settings apply_deepspeed(const gpt_config& mc, zshard::engine_config& cfg,
                                                          train_options& o) {
  auto ds = zshard::config::read_deepspeed_config(o.deepspeed_config, {.hidden_size = std::size_t(mc.d_model)});
  for (const auto& k : ds.unknown_keys)
    std::fprintf(stderr, "%s\n",
                 ("02_train_gpt: warning: " + o.deepspeed_config + ": unknown key '" + k + "' ignored").c_str());
  for (const auto& n : ds.notes) std::printf("deepspeed config: %s\n", n.c_str());
  zshard::engine_config c = ds.engine;
  c.log = cfg.log;
  // An explicit option wins; say what it replaces when the file set it to something else.
  const auto overrides = [&](const std::string& flag, const std::string& value, const std::string& key,
                             const std::string& file_value) {
    if (ds.sets(key) && value != file_value)
      std::printf("deepspeed config: %s%s%s (command line) overrides %s = %s\n", flag.c_str(), value.empty() ? "" : " ",
                  value.c_str(), key.c_str(), file_value.c_str());
  };
  if (o.was_given("--bf16")) {
    if (c.param_dtype == zshard::dtype::f16)
      throw std::invalid_argument("--bf16 conflicts with " + o.deepspeed_config +
                                  "'s fp16.enabled = true (two working precisions; the file's loss-scale settings are "
                                  "for fp16): drop --bf16, or enable bf16 instead of fp16 in the file");
    if (c.param_dtype != zshard::dtype::bf16) overrides("--bf16", "", "bf16.enabled", "false");
    c.param_dtype = zshard::dtype::bf16;
  }
  o.bf16 = c.param_dtype == zshard::dtype::bf16;
  if (o.was_given("--lr")) {
    overrides("--lr", detail::show(o.lr), "optimizer.params.lr", detail::show(c.adamw.lr));
    c.adamw.lr = o.lr;
  }
  o.lr = c.adamw.lr;
  if (o.was_given("--clip")) {
    overrides("--clip", detail::show(o.clip), "gradient_clipping", detail::show(c.clip_norm));
    c.clip_norm = o.clip;
  }
  o.clip = c.clip_norm;
  if (o.was_given("--micro"))
    overrides("--micro", std::to_string(o.micro_batches), "gradient_accumulation_steps",
              std::to_string(ds.gradient_accumulation_steps));
  else
    o.micro_batches = ds.gradient_accumulation_steps;
  if (o.was_given("--batch"))
    overrides("--batch", std::to_string(o.batch), "train_micro_batch_size_per_gpu",
              std::to_string(ds.micro_batch_size.value_or(0)));
  else if (ds.micro_batch_size)
    o.batch = *ds.micro_batch_size;
  cfg = c;
  if (cfg.param_dtype == zshard::dtype::f16)
    std::printf("deepspeed config: fp16 working parameters with dynamic loss scaling\n");
  if (ds.offload_optimizer || ds.offload_param) {
    std::printf("deepspeed config: offload_optimizer / offload_param: on the host backend device memory is host memory, "
                "so this example keeps offload::on_device and every tier on the device (zshard_plan "
                "--deepspeed-config shows the offloaded plan)\n");
    cfg.offload.params = zshard::offload_tier::device;
    cfg.offload.optimizer_state = zshard::offload_tier::host;
  }
  return ds;
}

}  // namespace gpt

#pragma once
// Reads a DeepSpeed-style JSON config (the file a ZeRO-3 user already has) into zshard's
// engine_config, so that a run moved to zshard keeps its budgets and hyper-parameters.
//
//   auto ds = zshard::config::read_deepspeed_config("ds_config.json", {.hidden_size = 8192});
//   for (const auto& line : ds.messages()) std::cerr << line << '\n';   // unknown keys, "auto"s
//   zshard::engine_config cfg = ds.engine;                               // then adjust as usual
//
// What maps (DeepSpeed key -> zshard):
//   zero_optimization.stage                       must be 3 (zshard is ZeRO stage 3); without it (or
//                                                 without zero_optimization) DeepSpeed would run stage 0:
//                                                 a note says zshard runs stage 3 all the same
//   zero_optimization.stage3_max_live_parameters  prefetch.max_live_numel
//   zero_optimization.stage3_prefetch_bucket_size prefetch.prefetch_numel
//   zero_optimization.stage3_param_persistence_threshold  partition.persistence_threshold_numel
//   zero_optimization.stage3_max_reuse_distance   prefetch.max_reuse_distance
//   zero_optimization.reduce_bucket_size          reduce.reduce_bucket_numel
//   zero_optimization.mics_shard_size             hybrid.shard_group_size (-1: plain ZeRO-3)
//   zero_optimization.overlap_comm                overlap
//   zero_optimization.offload_optimizer.device    cpu: offload_optimizer (use offload::host_adam); nvme: the
//                                                 same with offload.optimizer_state = nvme; none: on device
//   zero_optimization.offload_optimizer.nvme_path offload.nvme_path (required with device nvme)
//   zero_optimization.offload_optimizer.buffer_count  offload.nvme_buffer_count (chunk buffers, >= 3)
//   zero_optimization.offload_optimizer.pin_memory  offload.pin_memory (and pin_memory)
//   zero_optimization.offload_param.device        cpu: offload.params = host (needs offload::host_adam);
//                                                 nvme is refused (no parameter shards on NVMe); none
//   zero_optimization.offload_param.pin_memory    offload.pin_memory (one host tier: must agree with the optimizer's)
//   aio.thread_count                              offload.nvme_io_threads
// Keys that would change what runs and that zshard cannot honour are refused by name (offload_param
// on NVMe, pin_memory that differs between parameters and optimizer, fewer than 3 buffers).
//   gradient_clipping                             clip_norm
//   gradient_accumulation_steps                   gradient_accumulation_steps (micro-batches per step: the loop's)
//   train_micro_batch_size_per_gpu                micro_batch_size (the loop's)
//   train_batch_size                              train_batch_size; check_batch_size(world, ...) refuses a
//                                                 run whose ranks x micro-batch x accumulation differ
//   bf16.enabled / fp16.enabled                   param_dtype; fp16's loss_scale, initial_scale_power,
//                                                 loss_scale_window, min_loss_scale -> loss_scale
//   optimizer {type Adam|AdamW, params lr, betas, eps, weight_decay}  adamw
// Keys DeepSpeed knows but zshard has no counterpart for are listed in notes(); keys neither
// knows are listed once each by their dotted name in unknown_keys. sets(key) says whether the
// file gave a key its value (not "auto", not absent), so a training loop whose own options
// override the file can say which value it replaced. A value of the wrong type,
// or out of range, is a zshard::error (config) that names the key.
//
// "auto" is what the Hugging Face Trainer fills in from its own arguments. zshard has no
// Trainer: with import_options::hidden_size set, the size keys follow the Trainer's rules
// (reduce_bucket_size = hidden^2, stage3_prefetch_bucket_size = 0.9 hidden^2,
// stage3_param_persistence_threshold = 10 hidden); every other "auto" keeps zshard's default
// (or the training loop's own setting), and each one is explained in notes().
//
// Needs nlohmann-json (Debian: nlohmann-json3-dev; CMake: nlohmann_json::nlohmann_json).
#if !__has_include(<nlohmann/json.hpp>)
#error \
    "zshard/config/deepspeed_config.hpp needs nlohmann-json: install nlohmann-json3-dev (or the nlohmann_json package) and link nlohmann_json::nlohmann_json"
#endif
#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/config/deepspeed_keys.hpp"
#include "zshard/config/json_reader.hpp"
#include "zshard/engine/engine_config.hpp"

namespace zshard::config {

struct import_options {
  // The model's hidden size: lets the Trainer's "auto" rules for the bucket sizes apply.
  std::optional<std::size_t> hidden_size{};
};

struct deepspeed_settings {
  engine_config engine;                   // every value that maps; the rest keeps zshard's defaults
  bool offload_optimizer = false;         // offload_optimizer.device "cpu" or "nvme": use offload::host_adam
  bool offload_param = false;             // offload_param.device == "cpu" (engine.offload.params = host)
  bool pin_memory = false;                // offload_optimizer.pin_memory (or offload_param's), as read
  int gradient_accumulation_steps = 1;    // micro-batches per optimizer step (the training loop runs them)
  std::optional<int> micro_batch_size;    // train_micro_batch_size_per_gpu, when a number
  std::optional<int> train_batch_size;    // train_batch_size, when a number (see check_batch_size)
  std::set<std::string> applied;          // dotted keys whose values the file set (see sets())
  std::string source = "deepspeed config";  // the file, for messages
  std::vector<std::string> unknown_keys;  // dotted names, once each, in file order
  std::vector<std::string> notes;         // "auto" values and keys with no zshard counterpart

  // Whether the file set `key` (dotted, e.g. "optimizer.params.lr") to a value.
  bool sets(std::string_view key) const { return applied.count(std::string(key)) != 0; }

  // DeepSpeed's rule: train_batch_size = world size x train_micro_batch_size_per_gpu x
  // gradient_accumulation_steps. A run whose numbers contradict the file's train_batch_size is
  // a configuration error (it would not train on the global batch the file says).
  void check_batch_size(int world, int micro_batch_size, int accumulation) const {
    if (!train_batch_size) return;
    const long long global = 1LL * world * micro_batch_size * accumulation;
    if (global == *train_batch_size) return;
    throw error(error_kind::config,
                source + ": train_batch_size = " + std::to_string(*train_batch_size) + " contradicts the run: " +
                    std::to_string(world) + " rank(s) x " + std::to_string(micro_batch_size) +
                    " sequence(s) per micro-batch x " + std::to_string(accumulation) +
                    " micro-batch(es) per step = " + std::to_string(global),
                "make train_batch_size = ranks x train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                "(or drop train_batch_size): change the file, the number of ranks or the micro-batch size");
  }

  // One line per unknown key and per note, ready to print.
  std::vector<std::string> messages() const {
    std::vector<std::string> out;
    for (const auto& k : unknown_keys) out.push_back("deepspeed config: unknown key '" + k + "' ignored");
    for (const auto& n : notes) out.push_back("deepspeed config: " + n);
    return out;
  }
};

namespace detail {

class deepspeed_reader {
 public:
  deepspeed_reader(std::string source, import_options opt) : in_(source), opt_(opt) { out_.source = std::move(source); }

  deepspeed_settings read(const nlohmann::ordered_json& root) {
    in_.require_object(root, "");
    for (const auto& [key, v] : root.items()) {
      if (key == "zero_optimization")
        zero(v);
      else if (key == "gradient_clipping") {
        if (auto x = in_.number(v, key, 0.0, INFINITY, "a norm >= 0 (0 turns clipping off)"))
          take(key, out_.engine.clip_norm, *x);
        else
          auto_note(key, "keeps clip_norm = " + fmt(out_.engine.clip_norm));
      } else if (key == "gradient_accumulation_steps") {
        if (auto x = in_.count(v, key, 1, 1 << 20))
          take(key, out_.gradient_accumulation_steps, int(*x));
        else
          auto_note(key, "keeps 1 micro-batch per step; the training loop decides");
      } else if (key == "train_micro_batch_size_per_gpu") {
        if (auto x = in_.count(v, key, 1, 1 << 20))
          take(key, out_.micro_batch_size, int(*x));
        else
          auto_note(key, "the training loop's batch size applies");
      } else if (key == "train_batch_size") {
        if (auto x = in_.count(v, key, 1, 1 << 30))
          take(key, out_.train_batch_size, int(*x));
        else
          auto_note(key, "the global batch is ranks x micro-batch size x gradient_accumulation_steps");
      } else if (key == "bf16" || key == "fp16")
        precision(key, v);
      else if (key == "optimizer")
        optimizer(v);
      else if (key == "aio")
        aio(v);
      else
        other(key);
    }
    if (out_.offload_param && !out_.offload_optimizer)
      in_.fail("zero_optimization.offload_param.device", "is \"cpu\" while offload_optimizer.device is not",
               "offloaded parameter shards are updated on the host: set offload_optimizer.device to \"cpu\" or "
               "\"nvme\"");
    if (nvme_ && out_.engine.offload.nvme_path.empty())
      in_.fail("zero_optimization.offload_optimizer.nvme_path", "is missing, and offload_optimizer.device is \"nvme\"",
               "name a directory on the NVMe drive that is to hold the optimizer state");
    if (half_[0] && half_[1])
      in_.fail("bf16.enabled and fp16.enabled", "are both true", "enable one working precision");
    if (!root.contains("zero_optimization"))
      note("no zero_optimization section: DeepSpeed would run without ZeRO (stage 0); zshard runs ZeRO stage 3 "
           "(parameters, gradients and optimizer state sharded: the same training, less memory per rank)");
    else if (root.at("zero_optimization").is_object() && !root.at("zero_optimization").contains("stage"))
      note("zero_optimization has no stage: DeepSpeed would run stage 0 (no ZeRO); zshard runs ZeRO stage 3 "
           "(parameters, gradients and optimizer state sharded: the same training, less memory per rank)");
    try {
      out_.engine.validate();
    } catch (const error& e) {
      in_.fail("the imported values", e.message(), e.hint());
    }
    return std::move(out_);
  }

 private:
  void zero(const nlohmann::ordered_json& z) {
    in_.require_object(z, "zero_optimization");
    auto& c = out_.engine;
    for (const auto& [k, v] : z.items()) {
      const std::string key = "zero_optimization." + k;
      if (k == "stage") {
        const auto s = in_.count(v, key, 0, 3);
        if (!s) in_.fail(key, "is \"auto\"", "zshard is ZeRO stage 3: set 3");
        if (*s != 3)
          in_.fail(key, "is " + std::to_string(*s) + ", zshard implements stage 3 only",
                   "set \"stage\": 3 (parameters, gradients and optimizer state sharded)");
        applied(key);
      } else if (k == "stage3_max_live_parameters") {
        size_key(v, key, c.prefetch.max_live_numel, 1, std::nullopt);
      } else if (k == "stage3_prefetch_bucket_size") {
        size_key(v, key, c.prefetch.prefetch_numel, 0, hidden_sq(0.9));
      } else if (k == "stage3_param_persistence_threshold") {
        size_key(v, key, c.partition.persistence_threshold_numel, 0,
                 opt_.hidden_size ? std::optional<std::size_t>(10 * *opt_.hidden_size) : std::nullopt);
      } else if (k == "stage3_max_reuse_distance") {
        size_key(v, key, c.prefetch.max_reuse_distance, 0, std::nullopt);
      } else if (k == "reduce_bucket_size") {
        size_key(v, key, c.reduce.reduce_bucket_numel, 1, hidden_sq(1.0));
      } else if (k == "mics_shard_size") {  // MiCS: shard within groups, replicate across them
        if (v.is_number_integer() && v.get<std::int64_t>() < 0) continue;  // DeepSpeed's -1: MiCS off
        if (const auto n = in_.count(v, key, 1, 1u << 20))
          take(key, c.hybrid.shard_group_size, int(*n));
        else
          auto_note(key, "keeps plain ZeRO-3 over the whole world");
      } else if (k == "overlap_comm") {
        if (auto b = in_.boolean(v, key))
          take(key, c.overlap, *b);
        else
          auto_note(key, "keeps overlap = on");
      } else if (k == "offload_optimizer") {
        offload_optimizer(v, key);
      } else if (k == "offload_param") {
        offload_param(v, key);
      } else {
        other(key);
      }
    }
  }

  void offload_optimizer(const nlohmann::ordered_json& o, const std::string& where) {
    in_.require_object(o, where);
    for (const auto& [k, v] : o.items()) {
      const std::string key = where + "." + k;
      if (k == "device") {
        const std::string d = in_.string(v, key);
        if (d == "cpu" || d == "nvme") {
          take(key, out_.offload_optimizer, true);
          nvme_ = d == "nvme";
          out_.engine.offload.optimizer_state = nvme_ ? offload_tier::nvme : offload_tier::host;
        } else if (d == "none") {
          take(key, out_.offload_optimizer, false);
        } else {
          in_.fail(key, "is \"" + d + "\"", "use \"cpu\", \"nvme\" or \"none\"");
        }
      } else if (k == "pin_memory") {
        pin_memory(v, key);
      } else if (k == "nvme_path") {
        out_.engine.offload.nvme_path = in_.string(v, key);
      } else if (k == "buffer_count") {
        if (auto n = in_.count(v, key, 3, 1 << 20))
          out_.engine.offload.nvme_buffer_count = int(*n);
        else
          auto_note(key, "keeps " + std::to_string(out_.engine.offload.nvme_buffer_count) + " chunk buffers");
      } else {
        other(key);
      }
    }
  }

  void offload_param(const nlohmann::ordered_json& o, const std::string& where) {
    in_.require_object(o, where);
    for (const auto& [k, v] : o.items()) {
      const std::string key = where + "." + k;
      if (k == "device") {
        const std::string d = in_.string(v, key);
        if (d == "nvme")
          in_.fail(key, "is \"nvme\": zshard keeps offloaded parameter shards in host memory, not on NVMe",
                   "use \"cpu\" (and offload_optimizer \"nvme\" for the optimizer state); size host memory with "
                   "zshard_plan --offload-param cpu");
        if (d != "cpu" && d != "none") in_.fail(key, "is \"" + d + "\"", "use \"cpu\" or \"none\"");
        out_.offload_param = d == "cpu";
        out_.engine.offload.params = out_.offload_param ? offload_tier::host : offload_tier::device;
      } else if (k == "pin_memory") {
        pin_memory(v, key);
      } else {
        other(key);
      }
    }
  }

  // One host tier holds parameters and optimizer state alike: one pin_memory for both.
  void pin_memory(const nlohmann::ordered_json& v, const std::string& key) {
    const auto b = in_.boolean(v, key);
    if (!b)
      return auto_note(key, "keeps pin_memory = " + std::string(out_.engine.offload.pin_memory ? "true" : "false"));
    if (pin_seen_ && *b != out_.engine.offload.pin_memory)
      in_.fail(key, std::string("= ") + (*b ? "true" : "false") + " differs from " + pin_key_,
               "zshard keeps offloaded parameters and optimizer state in one host tier: give both the same value");
    pin_seen_ = true;
    pin_key_ = key;
    out_.pin_memory = out_.engine.offload.pin_memory = *b;
  }

  // DeepSpeed's asynchronous I/O settings: the thread count maps, the rest are notes.
  void aio(const nlohmann::ordered_json& a) {
    in_.require_object(a, "aio");
    for (const auto& [k, v] : a.items()) {
      const std::string key = "aio." + k;
      if (k == "thread_count") {
        if (auto n = in_.count(v, key, 1, 64)) out_.engine.offload.nvme_io_threads = int(*n);
      } else {
        other(key);
      }
    }
  }

  void precision(const std::string& which, const nlohmann::ordered_json& p) {
    in_.require_object(p, which);
    const bool f16 = which == "fp16";
    bool enabled = false;
    if (p.contains("enabled")) {
      const auto b = in_.boolean(p.at("enabled"), which + ".enabled");
      if (!b) auto_note(which + ".enabled", "counts as false: say true or false");
      else applied(which + ".enabled");
      enabled = b.value_or(false);
    }
    half_[f16 ? 1 : 0] = enabled;
    if (enabled) out_.engine.param_dtype = f16 ? dtype::f16 : dtype::bf16;
    auto& ls = out_.engine.loss_scale;
    if (f16 && enabled) ls.enabled = true;
    for (const auto& [k, v] : p.items()) {
      const std::string key = which + "." + k;
      if (k == "enabled") continue;
      if (!f16) {
        other(key);
      } else if (k == "loss_scale") {
        const auto s = in_.number(v, key, 0.0, 1e38, "0 (dynamic) or a positive static scale");
        if (s && *s > 0) {  // static: never grows, never backs off (min_scale pins it)
          ls.initial_scale = ls.min_scale = float(*s);
          ls.growth_interval = std::numeric_limits<int>::max();
          note(key + " = " + fmt(*s) + ": a static scale; overflowing steps are still skipped");
        }
      } else if (k == "initial_scale_power") {
        if (auto e = in_.count(v, key, 0, 120)) ls.initial_scale = std::ldexp(1.0f, int(*e));
      } else if (k == "loss_scale_window") {
        if (auto w = in_.count(v, key, 1, std::numeric_limits<int>::max())) ls.growth_interval = int(*w);
      } else if (k == "min_loss_scale") {
        if (auto m = in_.number(v, key, 0.0, 1e38, "a positive scale")) {
          if (!(*m > 0)) in_.fail(key, "is 0", "use a positive scale such as 1");
          ls.min_scale = float(*m);
        }
      } else {
        other(key);
      }
    }
  }

  void optimizer(const nlohmann::ordered_json& o) {
    in_.require_object(o, "optimizer");
    for (const auto& [k, v] : o.items()) {
      if (k == "type") {
        std::string t = in_.string(v, "optimizer.type");
        for (auto& ch : t) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        if (t != "adamw" && t != "adam" && t != "cpuadam" && t != "fusedadam")
          in_.fail("optimizer.type", "is \"" + in_.string(v, "optimizer.type") + "\": zshard runs AdamW",
                   "use \"AdamW\" (or drop the optimizer section and set engine_config::adamw)");
      } else if (k == "params") {
        adam_params(v);
      } else {
        other("optimizer." + k);
      }
    }
  }

  void adam_params(const nlohmann::ordered_json& p) {
    in_.require_object(p, "optimizer.params");
    auto& a = out_.engine.adamw;
    for (const auto& [k, v] : p.items()) {
      const std::string key = "optimizer.params." + k;
      if (k == "lr") {
        if (auto x = in_.number(v, key, 1e-30, 1e30, "a positive learning rate"))
          take(key, a.lr, float(*x));
        else
          auto_note(key, "the training loop sets it (engine::set_lr); until then lr = " + fmt(a.lr));
      } else if (k == "betas") {
        if (in_.is_auto(v)) {
          auto_note(key, "keeps (" + fmt(a.beta1) + ", " + fmt(a.beta2) + ")");
          continue;
        }
        if (!v.is_array() || v.size() != 2) in_.fail(key, "must be a list of two numbers", "e.g. [0.9, 0.95]");
        a.beta1 = float(*in_.number(v[0], key + "[0]", 0.0, 0.999999, "a decay in [0, 1)"));
        a.beta2 = float(*in_.number(v[1], key + "[1]", 0.0, 0.999999999, "a decay in [0, 1)"));
        applied(key);
      } else if (k == "eps") {
        if (auto x = in_.number(v, key, 1e-30, 1.0, "a small positive value"))
          take(key, a.eps, float(*x));
        else
          auto_note(key, "keeps " + fmt(a.eps));
      } else if (k == "weight_decay") {
        if (auto x = in_.number(v, key, 0.0, 1e6, "a decay >= 0"))
          take(key, a.weight_decay, float(*x));
        else
          auto_note(key, "keeps " + fmt(a.weight_decay));
      } else {
        other(key);
      }
    }
  }

  // A size in elements: a whole number (5e8 is fine), or "auto" (the Trainer rule if known).
  void size_key(const nlohmann::ordered_json& v, const std::string& key, std::size_t& into, std::size_t min,
                std::optional<std::size_t> trainer_auto) {
    if (auto n = in_.count(v, key, min, std::size_t{1} << 53)) {
      into = std::size_t(*n);
      applied(key);
    } else if (trainer_auto) {
      into = *trainer_auto;
      applied(key);
      auto_note(key, "= " + std::to_string(into) + " (the Trainer's rule for hidden_size " +
                         std::to_string(*opt_.hidden_size) + ")");
    } else {
      auto_note(key,
                "keeps zshard's default " + std::to_string(into) +
                    (opt_.hidden_size ? std::string() : " (give import_options::hidden_size for the Trainer's rule)"));
    }
  }
  std::optional<std::size_t> hidden_sq(double f) const {
    if (!opt_.hidden_size) return std::nullopt;
    return std::size_t(f * double(*opt_.hidden_size) * double(*opt_.hidden_size));
  }

  void other(const std::string& key) {
    if (const char* why = no_counterpart(key))
      note(key + ": no counterpart in zshard (" + why + ")");
    else if (seen_.insert(key).second)
      out_.unknown_keys.push_back(key);
  }
  void auto_note(const std::string& key, const std::string& what) {
    note(key + " is \"auto\" (the Hugging Face Trainer fills it in; zshard has none): " + what);
  }
  void note(std::string line) { out_.notes.push_back(std::move(line)); }
  void applied(const std::string& key) { out_.applied.insert(key); }
  // A value the file gives `key`: stored, and the key marked as set.
  template <class T, class V>
  void take(const std::string& key, T& into, V value) {
    into = static_cast<T>(value);
    applied(key);
  }
  static std::string fmt(double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  }

  json_reader in_;
  import_options opt_;
  deepspeed_settings out_;
  bool half_[2] = {false, false};
  bool nvme_ = false;      // offload_optimizer.device is "nvme"
  bool pin_seen_ = false;  // a pin_memory key was read (pin_key_ names it)
  std::string pin_key_;
  std::set<std::string> seen_;
};

}  // namespace detail

// Parses `text` (a DeepSpeed JSON config); `source` names it in errors (a file name).
inline deepspeed_settings parse_deepspeed_config(std::string_view text, import_options opt = {},
                                                 const std::string& source = "deepspeed config") {
  nlohmann::ordered_json root;
  try {
    root = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, true, /*ignore_comments=*/true);
  } catch (const nlohmann::ordered_json::parse_error& e) {
    throw error(error_kind::config, source + ": not valid JSON (" + e.what() + ")",
                "check the file with `python3 -m json.tool FILE`");
  }
  return detail::deepspeed_reader(source, opt).read(root);
}

inline deepspeed_settings read_deepspeed_config(const std::string& path, import_options opt = {}) {
  std::ifstream f(path, std::ios::binary);
  ZSHARD_REQUIRE(f.good(), error_kind::io, "cannot open DeepSpeed config '" + path + "'",
                 "check the path given to --deepspeed-config");
  std::ostringstream text;
  text << f.rdbuf();
  return parse_deepspeed_config(text.str(), opt, path);
}

}  // namespace zshard::config

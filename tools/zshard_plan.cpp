// zshard_plan: each rank's peak memory under zshard, by ledger category, before anything runs
// (plan/memory_plan.hpp), for a Llama shape or for any model and training schedule in a
// schedule file (plan/schedule_file.hpp, docs/schedule_format.md; written by hand or recorded
// from a step function). Defaults are the seed scenario (bench/seed_scenario.hpp); every
// setting can be changed on the command line, --simulate runs the real engine on the phantom
// backend beside the plan, and the GPU's own terms (CUDA context, NCCL, pool, workspaces)
// count in whether it fits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fstream>

#include "zshard/core/read_number.hpp"
#include "zshard/plan/hf_shape.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/config/deepspeed_config.hpp"
#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/schedule_file.hpp"
#include "zshard/prefetch/on_demand.hpp"
#include "../bench/seed_scenario.hpp"
#include "zshard_fit.hpp"

using namespace zshard;
using namespace zshard::plan;
using namespace zshard_bench;

namespace {

constexpr const char* usage_text = R"(usage: zshard_plan [options]
       zshard_plan --schedule FILE [options]

Plans each rank's peak memory for training with zshard (ZeRO-3), by ledger category, for the
device and (optimizer offloaded) the host: a Llama shape (defaults: the seed scenario), or the
model and training schedule of a schedule file (docs/schedule_format.md: written by hand, or
recorded from your own step function with zshard::plan::record_schedule and written with
write_schedule_file; the file's settings are the defaults, options below override them).

  --schedule FILE       plan the model and schedule in FILE instead of a Llama shape
  --model NAME          llama3-8b | llama3-70b | llama2-13b        (default llama3-70b)
  --hf-config FILE      the Llama a Hugging Face config.json describes (or a checkpoint
                        directory holding one): layers, sizes, heads, vocab, tied embeddings
  --hooks on|off        modules at DeepSpeed's hook granularity (projections and norms),
                        each block a checkpointed segment; off: one module per block (default on)
  --world N             data-parallel ranks                        (default 8)
  --shard-group N       hybrid sharding: ranks per shard group, replicated across the
                        world / N groups (default 0: ZeRO-3 over the whole world)
  --ranks-per-node N    ranks per node, to check the groups fit the nodes (default 0: unchecked)
  --device-gib G        device memory per rank: says whether the plan fits
  --micro-batch B       sequences per micro-batch                  (default 1)
  --seq S               tokens per sequence                        (default 4096)
  --micro-batches M     micro-batches per optimizer step           (default 1)
  --checkpoint on|off   activation checkpointing per block         (default on)
  --optimizer device|host  where AdamW state lives                 (default host)
  --offload-optimizer none|cpu|nvme  as DeepSpeed says it: none = --optimizer device,
                        cpu = --optimizer host, nvme = host AdamW with master and moments in
                        files (the NVMe tier: two slots, chunk buffers in host memory)
  --offload-param none|cpu  parameter shards in host memory, uploaded per gather (default none)
  --nvme-chunk N        elements per NVMe chunk, a multiple of 1024 (default 1048576)
  --nvme-buffers N      NVMe chunk buffers in host memory, >= 3       (default 4)
  --pin-memory on|off   host tier page-locked (pinned) or pageable    (default on)
  --dtype bf16|f16|f32  parameter and activation dtype             (default bf16)
  --max-live N          max_live_numel, gathered elements          (default 1e9)
  --prefetch N          prefetch_numel, elements gathered ahead    (default 5e7)
  --bucket N            reduce_bucket_numel                        (default 5e8)
  --prefetcher trace|on-demand                                     (default trace)
  --allow-oversized on|off  a module above --max-live may run alone (default on; the
                        engine's default is off: 70B's embedding and head need it)
  --gpu on|off          add the GPU's own terms to the device total (default on):
  --context-mib N       CUDA context                               (default 512)
  --nccl-mib N          NCCL buffers per communicator              (default 512)
  --workspace-mib N     cuBLAS/cuDNN/attention workspaces          (default 256)
  --fragmentation F     pool reserve beyond the peak, a fraction   (default 0.05)
  --deepspeed-config FILE  start from a DeepSpeed JSON config (zero_optimization sizes,
                        offload_optimizer, offload_param, bf16/fp16, gradient_accumulation_steps,
                        train_micro_batch_size_per_gpu); options given here override it
  --simulate            also run the engine on the phantom backend and print the run's
                        peaks beside the plan
  --fit                 search for the fastest configuration that fits a machine instead
                        (zshard_plan --fit --help)
  --help                this text

Counts take integers or scientific notation (5e8). Exit status: 0 done, 1 the engine would
refuse the configuration, 2 bad command line.
)";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  std::optional<std::string> schedule_path;
  std::vector<std::pair<std::string, std::string>> overrides;  // settings applied over a schedule file's
  bool hooks = true;
  device_overheads gpu = device_overheads::cuda_defaults();
  transformer_shape shape = llama3_70b();
  int world = 8;
  std::optional<double> device_gib;
  activation_options act = seed_scenario{}.activations;
  optimizer_location optimizer = optimizer_location::host;
  prefetch_policy prefetcher = prefetch_policy::trace;
  engine_config cfg = seed_scenario{}.config();
  bool simulate = false;
};

// What the word `v` given to `flag` means, among `words`, or a usage error that lists them.
template <class T>
T one_of(const std::string& flag, const std::string& v, std::initializer_list<std::pair<const char*, T>> words) {
  std::string list;
  std::size_t i = 0;
  for (const auto& [word, meaning] : words) {
    if (v == word) return meaning;
    list += std::string(i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + word;
    ++i;
  }
  throw usage_error(flag + " takes " + list + ", not '" + v + "'");
}

bool on_off(const std::string& flag, const std::string& v) {
  return one_of<bool>(flag, v, {{"on", true}, {"off", false}});
}

double number(const std::string& flag, const std::string& v) {
  if (const auto x = read_number(v)) return *x;
  throw usage_error(flag + " takes a number, not '" + v + "'");
}

// A positive whole count up to 2^53 (exact in a double), e.g. 500000000 or 5e8.
std::size_t count(const std::string& flag, const std::string& v) {
  (void)number(flag, v);  // not a number at all: said as such
  const std::optional<std::size_t> n = read_count(v);
  if (!n || *n < 1) throw usage_error(flag + " takes a positive whole count, not '" + v + "'");
  return *n;
}

// --hf-config FILE: a config the planner cannot read is a bad command line (exit 2), said whole.
transformer_shape hf_shape(const std::string& path) {
  try {
    return transformer_shape_from_hf_config(path);
  } catch (const error& e) {
    throw usage_error("--hf-config: " + std::string(e.what()));
  }
}

// --deepspeed-config FILE: its values first (with --model's hidden size for the Trainer's
// "auto" rules), so that every other option on the command line overrides them.
void apply_deepspeed_config(options& o, const std::vector<std::string>& args) {
  std::string path;
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--deepspeed-config") path = args[i + 1];
    if (args[i] == "--model")
      if (auto s = transformer_shape_named(args[i + 1])) o.shape = *s;
    if (args[i] == "--hf-config") o.shape = hf_shape(args[i + 1]);
  }
  if (path.empty()) return;
  const auto ds = config::read_deepspeed_config(path, {.hidden_size = std::size_t(o.shape.hidden)});
  for (const auto& line : ds.messages()) std::cerr << "zshard_plan: " << line << '\n';
  const bool oversized = o.cfg.prefetch.allow_oversized_module;  // a planner default, not a DeepSpeed key
  o.cfg = ds.engine;
  o.cfg.prefetch.allow_oversized_module = oversized;
  o.act.activation_type = o.cfg.param_dtype;
  o.optimizer = ds.offload_optimizer ? optimizer_location::host : optimizer_location::device;
  if (o.cfg.offload.nvme_path.empty()) o.cfg.offload.nvme_path = "(planned)";
  o.act.micro_batches = ds.gradient_accumulation_steps;
  if (ds.micro_batch_size) o.act.micro_batch = *ds.micro_batch_size;
}

// A whole count of ranks for `flag`, refused when implausible.
int ranks(const std::string& flag, const std::string& v) {
  const std::size_t n = count(flag, v);
  if (n > 1'000'000) throw usage_error(flag + " " + v + " is not a plausible number of ranks");
  return int(n);
}

// One entry per option that takes a value: what it sets, and whether a schedule file has that
// setting too (then the command line's value is applied over the file's, by the same code).
struct option_rule {
  const char* flag;
  bool file_setting;
  void (*apply)(options& o, const std::string& flag, const std::string& v);
};

const option_rule option_rules[] = {
    {"--deepspeed-config", false, [](options&, const std::string&, const std::string&) {}},  // applied first
    {"--schedule", false, [](options& o, const std::string&, const std::string& v) { o.schedule_path = v; }},
    {"--hooks", false, [](options& o, const std::string& a, const std::string& v) { o.hooks = on_off(a, v); }},
    {"--gpu", false,
     [](options& o, const std::string& a, const std::string& v) {
       if (!on_off(a, v)) o.gpu = device_overheads::none();
     }},
    {"--context-mib", false,
     [](options& o, const std::string& a, const std::string& v) { o.gpu.cuda_context_bytes = count(a, v) << 20; }},
    {"--nccl-mib", false,
     [](options& o, const std::string& a, const std::string& v) {
       o.gpu.nccl_bytes_per_communicator = count(a, v) << 20;
     }},
    {"--workspace-mib", false,
     [](options& o, const std::string& a, const std::string& v) { o.gpu.workspace_bytes = count(a, v) << 20; }},
    {"--fragmentation", false,
     [](options& o, const std::string& a, const std::string& v) {
       const double f = number(a, v);
       if (f < 0 || f > 10) throw usage_error("--fragmentation takes a fraction between 0 and 10");
       o.gpu.fragmentation = f;
     }},
    {"--model", false,
     [](options& o, const std::string&, const std::string& v) {
       auto s = transformer_shape_named(v);
       if (!s) throw usage_error("unknown model '" + v + "' (known: llama3-8b, llama3-70b, llama2-13b)");
       o.shape = *s;
     }},
    {"--hf-config", false,
     [](options& o, const std::string&, const std::string& v) { o.shape = hf_shape(v); }},
    {"--world", true, [](options& o, const std::string& a, const std::string& v) { o.world = ranks(a, v); }},
    {"--shard-group", true,
     [](options& o, const std::string& a, const std::string& v) { o.cfg.hybrid.shard_group_size = ranks(a, v); }},
    {"--ranks-per-node", true,
     [](options& o, const std::string& a, const std::string& v) { o.cfg.hybrid.ranks_per_node = ranks(a, v); }},
    {"--device-gib", false,
     [](options& o, const std::string& a, const std::string& v) {
       const double g = number(a, v);
       if (g <= 0) throw usage_error("--device-gib must be positive");
       o.device_gib = g;
     }},
    {"--micro-batch", false,
     [](options& o, const std::string& a, const std::string& v) {
       o.act.micro_batch = std::int64_t(std::min<std::size_t>(count(a, v), 1u << 31));
     }},
    {"--seq", false,
     [](options& o, const std::string& a, const std::string& v) {
       o.act.seq_len = std::int64_t(std::min<std::size_t>(count(a, v), 1u << 31));
     }},
    {"--micro-batches", false,
     [](options& o, const std::string& a, const std::string& v) {
       const std::size_t n = count(a, v);
       if (n > 1000) throw usage_error("--micro-batches " + v + " is more than 1000");
       o.act.micro_batches = int(n);
     }},
    {"--checkpoint", false,
     [](options& o, const std::string& a, const std::string& v) { o.act.checkpoint = on_off(a, v); }},
    {"--optimizer", true,
     [](options& o, const std::string& a, const std::string& v) {
       o.optimizer = one_of<optimizer_location>(
           a, v, {{"device", optimizer_location::device}, {"host", optimizer_location::host}});
     }},
    {"--offload-optimizer", true,
     [](options& o, const std::string& a, const std::string& v) {
       o.cfg.offload.optimizer_state = one_of<offload_tier>(
           a, v, {{"none", offload_tier::host}, {"cpu", offload_tier::host}, {"nvme", offload_tier::nvme}});
       o.optimizer = v == "none" ? optimizer_location::device : optimizer_location::host;
       if (o.cfg.offload.nvme_path.empty()) o.cfg.offload.nvme_path = "(planned)";  // no file is made
     }},
    {"--offload-param", true,
     [](options& o, const std::string& a, const std::string& v) {
       if (v == "nvme")
         throw usage_error("--offload-param nvme: parameter shards on NVMe are not implemented; use cpu");
       o.cfg.offload.params = one_of<offload_tier>(a, v, {{"none", offload_tier::device}, {"cpu", offload_tier::host}});
     }},
    {"--nvme-chunk", true,
     [](options& o, const std::string& a, const std::string& v) { o.cfg.offload.nvme_chunk_numel = count(a, v); }},
    {"--nvme-buffers", true,
     [](options& o, const std::string& a, const std::string& v) {
       const std::size_t n = count(a, v);
       if (n > 1024) throw usage_error("--nvme-buffers " + v + " is more than 1024");
       o.cfg.offload.nvme_buffer_count = int(n);
     }},
    {"--pin-memory", true,
     [](options& o, const std::string& a, const std::string& v) { o.cfg.offload.pin_memory = on_off(a, v); }},
    {"--dtype", true,
     [](options& o, const std::string& a, const std::string& v) {
       o.cfg.param_dtype = one_of<dtype>(a, v, {{"bf16", dtype::bf16}, {"f16", dtype::f16}, {"f32", dtype::f32}});
       o.act.activation_type = o.cfg.param_dtype;
     }},
    {"--max-live", true,
     [](options& o, const std::string& a, const std::string& v) { o.cfg.prefetch.max_live_numel = count(a, v); }},
    {"--prefetch", true,
     [](options& o, const std::string& a, const std::string& v) { o.cfg.prefetch.prefetch_numel = count(a, v); }},
    {"--bucket", true,
     [](options& o, const std::string& a, const std::string& v) { o.cfg.reduce.reduce_bucket_numel = count(a, v); }},
    {"--prefetcher", false,
     [](options& o, const std::string& a, const std::string& v) {
       o.prefetcher = one_of<prefetch_policy>(
           a, v, {{"trace", prefetch_policy::trace}, {"on-demand", prefetch_policy::on_demand}});
     }},
    {"--allow-oversized", true,
     [](options& o, const std::string& a, const std::string& v) {
       o.cfg.prefetch.allow_oversized_module = on_off(a, v);
     }},
};

const option_rule* rule_for(const std::string& flag) {
  for (const auto& r : option_rules)
    if (flag == r.flag) return &r;
  return nullptr;
}

options parse(const std::vector<std::string>& args) {
  options o;
  o.act.micro_batches = 1;
  apply_deepspeed_config(o, args);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--simulate") {
      o.simulate = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) throw usage_error("unexpected argument '" + a + "'");
    // every other option takes a value: an unknown one is named as such, not as missing its value
    const option_rule* rule = rule_for(a);
    if (!rule) throw usage_error("unknown option '" + a + "'");
    if (i + 1 >= args.size()) throw usage_error(a + " needs a value");
    const std::string& v = args[++i];
    rule->apply(o, a, v);
    if (rule->file_setting) o.overrides.emplace_back(a, v);
  }
  bool model = false, hf = false;
  for (const auto& a : args) {
    model = model || a == "--model";
    hf = hf || a == "--hf-config";
  }
  if (model && hf) throw usage_error("--model and --hf-config both name the model: give one");
  // Activation bytes are products of these: keep them far from overflowing 64 bits.
  if (o.act.micro_batch * o.act.seq_len > 1'000'000'000)
    throw usage_error("--micro-batch x --seq is more than 1e9 tokens per micro-batch");
  return o;
}

template <class Offloader, class Prefetcher>
struct tool_policies : default_policies {
  using offloader = Offloader;
  using prefetcher = Prefetcher;
};

template <class Offloader>
phantom_result simulate(const options& o, const model_spec& spec, const engine_config& cfg, int world,
                        const training_schedule& s, int steps) {
  if (o.prefetcher == prefetch_policy::trace)
    return run_phantom<tool_policies<Offloader, prefetch::trace>>(spec, cfg, world, s, steps);
  return run_phantom<tool_policies<Offloader, prefetch::on_demand>>(spec, cfg, world, s, steps);
}

double gib(std::size_t bytes) { return double(bytes) / double(std::size_t{1} << 30); }

// Prints the plan (and a simulation beside it) and the key figures.
int report(const options& o, const model_spec& spec, const engine_config& cfg, int world, optimizer_location optimizer,
           const training_schedule& schedule) {
  const bool gpu = o.gpu.total(0) > 0;  // the GPU's terms: a device whose host tier may be page-locked
  const bool pinned = gpu && cfg.offload.pin_memory && optimizer == optimizer_location::host;
  const memory_plan plan = plan_memory(
      spec, cfg, world, schedule,
      {.optimizer = optimizer, .prefetcher = o.prefetcher, .overheads = o.gpu, .host_pinned = pinned});
  std::optional<phantom_result> sim;
  if (o.simulate) {
    const int steps = plan.steps_simulated + int(schedule.cycle.size());
    sim = optimizer == optimizer_location::host ? simulate<offload::host_adam>(o, spec, cfg, world, schedule, steps)
                                                : simulate<offload::on_device>(o, spec, cfg, world, schedule, steps);
  }
  print_plan(std::cout, plan, sim ? &sim->peak_step() : nullptr, sim && sim->host ? &*sim->host : nullptr,
             sim && sim->nvme ? &*sim->nvme : nullptr);
  const device_overheads& d = plan.overheads;
  if (d.total(plan.device.total_peak) > 0)
    std::printf(
        "device beyond the ledger: CUDA context %.3f GiB, NCCL %.3f GiB (%d communicator(s)), pool %.3f GiB "
        "(%.0f%% fragmentation, %zu MiB granules), workspaces %.3f GiB\n",
        gib(d.cuda_context_bytes), gib(d.nccl_bytes()), d.communicators, gib(d.pool_bytes(plan.device.total_peak)),
        100 * d.fragmentation, d.pool_granularity_bytes >> 20, gib(d.workspace_bytes));
  std::printf("\npeak_gib_per_rank: %.3f\n", gib(plan.device.total_peak));
  std::printf("device_total_gib_per_rank: %.3f\n", gib(plan.device_total()));
  std::printf("peak_phase: %s\n", plan.device.peak_phase.c_str());
  std::printf("host_gib_per_rank: %.3f\n", gib(plan.host.total_peak));
  std::printf("pinned_host_gib_per_rank: %.3f\n", gib(plan.host_pinned ? plan.host.total_peak : 0));
  std::printf("pageable_host_gib_per_rank: %.3f\n", gib(plan.host_pinned ? 0 : plan.host.total_peak));
  std::printf("nvme_gib_per_rank: %.3f\n", gib(plan.nvme.total_peak));
  std::printf("pcie_gib_per_step: %.3f\n", gib(plan.moved.to_device + plan.moved.to_host));
  std::printf("disk_gib_per_step: %.3f\n", gib(plan.moved.disk_read + plan.moved.disk_written));
  std::printf("steps_planned: %d\n", plan.steps_simulated);
  std::printf("peak_bytes_per_rank: %zu\n", plan.device.total_peak);
  std::printf("shard_group_ranks: %d\n", plan.shard_group);
  std::printf("sent_in_group_gib_per_step: %.3f\n", gib(plan.traffic.shard_group));
  std::printf("sent_across_groups_gib_per_step: %.3f\n", gib(plan.traffic.across_groups));
  if (sim) {
    const bool same = plan.traffic.total() == sim->bytes_sent_per_step &&
                      plan.traffic.across_groups == sim->across_groups_bytes_per_step &&
                      plan.moved == sim->moved_per_step;
    std::printf("simulated_bytes_match_plan: %s\n", same ? "yes" : "no (max_live_numel binds: gathers differ)");
    std::printf("simulated_peak_gib: %.3f\n", gib(sim->peak()));
    bool within = sim->peak() <= plan.device.total_peak &&
                  (!sim->nvme || sim->nvme->total_peak() == plan.nvme.total_peak) &&
                  (!sim->host || sim->host->total_peak() <= plan.host.total_peak);
    for (const auto& l : sim->steps)
      for (std::size_t i = 0; i < mem_category_count; ++i)
        within = within && l.peak(mem_category(i)) <= plan.device.peak[i];
    std::printf("simulation_within_plan: %s\n", within ? "yes" : "NO");
  }
  if (o.device_gib) {
    const auto budget = static_cast<std::size_t>(*o.device_gib * double(std::size_t{1} << 30));
    std::printf("fits: %s (%.3f of %.3f GiB)\n", plan.fits(budget) ? "yes" : "no", gib(plan.device_total()),
                *o.device_gib);
  }
  return 0;
}

// Where the optimizer state lives, in words.
std::string tier_words(optimizer_location optimizer, const engine_config& cfg) {
  if (optimizer == optimizer_location::device) return "device";
  return cfg.offload.optimizer_state == offload_tier::nvme ? "host, its state on NVMe" : "host";
}

int run_llama(const options& o) {
  const transformer_model model = o.hooks ? build_transformer_hooks(o.shape) : build_transformer(o.shape);
  const training_schedule schedule{
      {o.hooks ? transformer_hook_program(model, o.act) : to_program(transformer_schedule(model, o.act))}};
  std::printf("%s: %.2fe9 parameters, %d layers, hidden %lld, %zu modules; %d ranks, %s, optimizer on the %s%s\n",
              o.shape.name.c_str(), double(o.shape.param_count()) / 1e9, o.shape.layers,
              static_cast<long long>(o.shape.hidden), model.spec.modules().size(), o.world,
              std::string(to_string(o.cfg.param_dtype)).c_str(), tier_words(o.optimizer, o.cfg).c_str(),
              o.cfg.offload.params == offload_tier::host ? ", parameter shards on the host" : "");
  std::printf(
      "micro-batch %lld x %lld tokens, %d per step, checkpointing %s; max_live %zu, prefetch %zu (%s), bucket %zu\n\n",
      static_cast<long long>(o.act.micro_batch), static_cast<long long>(o.act.seq_len), o.act.micro_batches,
      o.act.checkpoint ? "on" : "off", o.cfg.prefetch.max_live_numel, o.cfg.prefetch.prefetch_numel,
      o.prefetcher == prefetch_policy::trace ? "trace" : "on-demand", o.cfg.reduce.reduce_bucket_numel);
  return report(o, model.spec, o.cfg, o.world, o.optimizer, schedule);
}

int run_file(const options& o) {
  std::ifstream in(*o.schedule_path);
  if (!in) throw usage_error("cannot read the schedule file '" + *o.schedule_path + "'");
  schedule_file f = read_schedule_file(in, *o.schedule_path);
  // The file's settings, then the command line's, applied over them as parse applies them.
  options over = o;
  over.world = f.world;
  over.optimizer = f.optimizer;
  over.cfg = f.cfg;
  for (const auto& [flag, value] : o.overrides) rule_for(flag)->apply(over, flag, value);
  f.world = over.world;
  f.optimizer = over.optimizer;
  f.cfg = over.cfg;
  f.cfg.log = [](const std::string&) {};  // a trace divergence in --simulate is planned for
  std::size_t events = 0;
  for (const auto& s : f.schedule.cycle) events += s.events.size();
  std::printf(
      "%s: %zu parameters (%.4ge9 elements), %zu modules; %d ranks, %s, optimizer on the %s\n"
      "%zu step program(s) in the cycle, %zu calls; max_live %zu, prefetch %zu (%s), bucket %zu\n\n",
      o.schedule_path->c_str(), f.spec.params().size(), double(f.spec.total_numel()) / 1e9, f.spec.modules().size(),
      f.world, std::string(to_string(f.cfg.param_dtype)).c_str(), tier_words(f.optimizer, f.cfg).c_str(),
      f.schedule.cycle.size(), events,
      f.cfg.prefetch.max_live_numel, f.cfg.prefetch.prefetch_numel,
      o.prefetcher == prefetch_policy::trace ? "trace" : "on-demand", f.cfg.reduce.reduce_bucket_numel);
  return report(o, f.spec, f.cfg, f.world, f.optimizer, f.schedule);
}

int run(const options& o) { return o.schedule_path ? run_file(o) : run_llama(o); }

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (zshard_tools::wants_fit(args)) return zshard_tools::run_fit(args);  // tools/zshard_fit.cpp
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << usage_text;
      return 0;
    }
  try {
    return run(parse(args));
  } catch (const usage_error& e) {
    std::cerr << "zshard_plan: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}

// zshard_plan --fit: the search of plan/fit_search.hpp on the command line. The model (a named
// Llama shape, a transformer shape given as numbers, the main job's GPT, or a schedule file), the
// global batch and the machine (a GPU kind's documented rates, each overridable) go in; the
// families and what rules each out, the fastest candidates with every term of their predicted
// step time, and the chosen configuration (C++ designated initialisers, a DeepSpeed JSON, the
// main job's command line) come out, then the key figures as `name: value`.
#include "zshard_fit.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fit_gpt_example.hpp"
#include "fit_host_calibration.hpp"
#include "fit_output.hpp"
#include "zshard/config/deepspeed_config.hpp"
#include "zshard/config/deepspeed_writer.hpp"
#include "zshard/core/read_number.hpp"
#include "zshard/plan/fit_search.hpp"
#include "zshard/plan/schedule_file.hpp"

namespace zshard_tools {

namespace {

using namespace zshard;
using namespace zshard::plan;

constexpr const char* fit_usage = R"(usage: zshard_plan --fit [options]

Searches the configurations of a training run (ZeRO stage, optimizer state on the device, the
host or NVMe, parameter shards on the device or the host, hybrid shard group, prefetch, live and
bucket budgets, micro-batch x accumulation for the global batch, activation checkpointing
none / every block / every k-th block) for the fastest that fits the machine. Every candidate
is checked by the memory plan (device, host and NVMe), ruled-out families say which term rules
them out, and the rest are ranked by a predicted step time (docs/fit_time_model.md) whose terms
are printed.

The model (one of):
  --model NAME            llama3-8b | llama3-70b | llama2-13b | gpt-example (the main job's model)
  --shape L,H,F,A,K,V     a Llama-style shape: layers, hidden, MLP width, heads, K/V heads, vocabulary
  --schedule FILE         a schedule file's model and step (docs/schedule_format.md): only the
                          stage, tiers, shard group and budgets are searched
  --hooks on|off          Llama shapes at DeepSpeed's hook granularity (default on)
The batch:
  --seq S                 tokens per sequence (default 4096; gpt-example 64)
  --global-batch-tokens N tokens per optimizer step over all ranks (default 1048576; gpt-example
                          16384; with --deepspeed-config: its ranks x micro-batch x accumulation)
  --dtype bf16|f16|f32    working dtype of parameters and activations (default bf16; gpt-example f32)
The machine (defaults from --gpu; docs/fit_time_model.md and plan/gpu_rates.hpp say where from):
  --gpu KIND              a100-80g | a100-40g | h100-sxm | h200 | l40s | host (default h100-sxm)
  --ranks-per-node N      (default 8)        --nodes N   (default 1)
  --device-gib G          device memory per rank
  --host-gib G            host memory per node   --nvme-gib G   NVMe per node (0: none)
  --gemm-tflops X  --compute-efficiency X  --hbm-gbps X  --intra-node-gbps X  --inter-node-gbps X
  --pcie-gbps X  --nvme-gbps X  --latency-us X  --host-adam-gelems X
  --calibrate-host        with --gpu host: measure this machine's rates first (GEMM, the main
                          job's forward and backward, AdamW, thread collectives)
The search:
  --top N                 candidates in the table (default 8)
  --exhaustive            plan every candidate that passes the floors (default: stop once no
                          candidate left can be among the fastest)
  --threads N             planning threads (default: the hardware's, at most 8)
  --nvme-path DIR         offload_config::nvme_path of NVMe candidates (default /local_nvme/zshard)
  --deepspeed-config FILE also plan and time this configuration (your current one) beside the
                          choice; its precision, AdamW, clipping and persistence threshold carry over
  --baseline-checkpoint K that configuration's checkpointing: 0 none, 1 every block (default), k
  --write-deepspeed-config FILE  the chosen configuration as a DeepSpeed JSON (read_deepspeed_config
                          maps it back; 02_train_gpt --deepspeed-config takes it)
  --write-cpp FILE        the chosen configuration as a C++ file (engine_config and policies)
Exit status: 0 a configuration fits, 1 nothing fits (or the engine refuses), 2 bad command line.
)";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct fit_options {
  std::string model = "llama3-70b";
  std::optional<transformer_shape> shape;
  std::string schedule_path;
  bool hooks = true;
  std::optional<std::int64_t> seq, global_tokens;
  std::optional<dtype> type;
  std::string gpu = "h100-sxm";
  std::vector<std::pair<std::string, double>> rates;  // overrides, applied in order
  int ranks_per_node = 8, nodes = 1;
  bool calibrate = false;
  int top = 8, threads = 0;
  bool exhaustive = false;
  std::string nvme_path = "/local_nvme/zshard";
  std::string deepspeed, write_deepspeed, write_cpp;
  int baseline_checkpoint = 1;
};

double number(const std::string& flag, const std::string& v, double min) {
  const auto x = read_number(v);
  if (!x || !(*x >= min)) throw usage_error(flag + " takes a number >= " + std::to_string(min) + ", not '" + v + "'");
  return *x;
}
long long whole(const std::string& flag, const std::string& v, long long min, long long max) {
  const auto n = read_count(v);
  if (!n || (long long)*n < min || (long long)*n > max)
    throw usage_error(flag + " takes a whole number in [" + std::to_string(min) + ", " + std::to_string(max) +
                      "], not '" + v + "'");
  return (long long)*n;
}

transformer_shape shape_of(const std::string& v) {
  std::vector<long long> n;
  std::stringstream in(v);
  std::string item;
  while (std::getline(in, item, ',')) n.push_back(whole("--shape", item, 1, 1LL << 40));
  if (n.size() != 6) throw usage_error("--shape takes six numbers: layers,hidden,mlp,heads,kv_heads,vocab");
  transformer_shape s{"shape", int(n[0]), n[1], n[2], int(n[3]), int(n[4]), n[5], false};
  try {
    s.validate();
  } catch (const error& e) {
    throw usage_error("--shape: " + e.message());
  }
  return s;
}

fit_options parse(const std::vector<std::string>& args) {
  fit_options o;
  const char* rate_flags[] = {"--device-gib",     "--host-gib",     "--nvme-gib",        "--gemm-tflops",
                              "--compute-efficiency", "--hbm-gbps", "--intra-node-gbps", "--inter-node-gbps",
                              "--pcie-gbps",      "--nvme-gbps",    "--latency-us",      "--host-adam-gelems"};
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--fit") continue;
    if (a == "--calibrate-host") { o.calibrate = true; continue; }
    if (a == "--exhaustive") { o.exhaustive = true; continue; }
    if (i + 1 >= args.size()) throw usage_error(a.rfind("--", 0) == 0 ? a + " needs a value (or is unknown)" : "unexpected '" + a + "'");
    const std::string& v = args[++i];
    if (std::find(std::begin(rate_flags), std::end(rate_flags), a) != std::end(rate_flags)) {
      o.rates.emplace_back(a, number(a, v, 0));
    } else if (a == "--model") {
      o.model = v;
    } else if (a == "--shape") {
      o.shape = shape_of(v);
    } else if (a == "--schedule") {
      o.schedule_path = v;
    } else if (a == "--hooks") {
      if (v != "on" && v != "off") throw usage_error("--hooks takes on or off");
      o.hooks = v == "on";
    } else if (a == "--seq") {
      o.seq = whole(a, v, 1, 1 << 24);
    } else if (a == "--global-batch-tokens") {
      o.global_tokens = whole(a, v, 1, 1LL << 50);
    } else if (a == "--dtype") {
      if (v == "bf16") o.type = dtype::bf16;
      else if (v == "f16") o.type = dtype::f16;
      else if (v == "f32") o.type = dtype::f32;
      else throw usage_error("--dtype takes bf16, f16 or f32");
    } else if (a == "--gpu") {
      if (!gpu_kind_named(v)) throw usage_error("unknown --gpu '" + v + "' (known: " + gpu_kind_names() + ")");
      o.gpu = v;
    } else if (a == "--ranks-per-node") {
      o.ranks_per_node = int(whole(a, v, 1, 4096));
    } else if (a == "--nodes") {
      o.nodes = int(whole(a, v, 1, 100000));
    } else if (a == "--top") {
      o.top = int(whole(a, v, 1, 1000));
    } else if (a == "--threads") {
      o.threads = int(whole(a, v, 1, 64));
    } else if (a == "--nvme-path") {
      o.nvme_path = v;
    } else if (a == "--deepspeed-config") {
      o.deepspeed = v;
    } else if (a == "--baseline-checkpoint") {
      o.baseline_checkpoint = int(whole(a, v, 0, 1 << 20));
    } else if (a == "--write-deepspeed-config") {
      o.write_deepspeed = v;
    } else if (a == "--write-cpp") {
      o.write_cpp = v;
    } else {
      throw usage_error("unknown option '" + a + "' for --fit");
    }
  }
  if (o.calibrate && o.gpu != "host") throw usage_error("--calibrate-host measures the host backend: give --gpu host");
  return o;
}

void apply_rates(gpu_rates& r, const std::vector<std::pair<std::string, double>>& over) {
  for (const auto& [flag, x] : over) {
    if (flag == "--device-gib") r.device_gib = x;
    else if (flag == "--host-gib") r.host_gib = x;
    else if (flag == "--nvme-gib") r.nvme_gib = x;
    else if (flag == "--gemm-tflops") r.gemm_tflops = x;
    else if (flag == "--compute-efficiency") r.compute_efficiency = x;
    else if (flag == "--hbm-gbps") r.hbm_gbps = x;
    else if (flag == "--intra-node-gbps") r.intra_node_gbps = x;
    else if (flag == "--inter-node-gbps") r.inter_node_gbps = x;
    else if (flag == "--pcie-gbps") r.pcie_gbps = x;
    else if (flag == "--nvme-gbps") r.nvme_gbps = x;
    else if (flag == "--latency-us") r.latency_us = x;
    else if (flag == "--host-adam-gelems") r.host_adam_gelems = x;
  }
}

// The configuration a DeepSpeed file describes, as a candidate of this problem.
fit_candidate candidate_of(const config::deepspeed_settings& ds, const fit_problem& pr, int checkpoint_every) {
  fit_candidate c;
  c.family.stage = 3;
  c.family.optimizer = !ds.offload_optimizer ? fit_optimizer::device
                       : ds.engine.offload.optimizer_state == offload_tier::nvme ? fit_optimizer::nvme
                                                                                 : fit_optimizer::host;
  c.family.params = ds.offload_param ? offload_tier::host : offload_tier::device;
  const int g = ds.engine.hybrid.shard_group_size;
  c.family.shard_group = g > 0 ? g : pr.world();
  c.prefetch_numel = ds.engine.prefetch.prefetch_numel;
  c.max_live_numel = ds.engine.prefetch.max_live_numel;
  std::size_t largest = 0;
  for (module_id m = 0; m < pr.model.spec.modules().size(); ++m) {
    std::size_t n = 0;
    for (param_id p : pr.model.spec.module(m).params) n += pr.model.spec.param(p).numel();
    largest = std::max(largest, n);
  }
  c.allow_oversized_module = largest > c.max_live_numel;  // as zshard_plan plans such a file
  c.bucket_numel = ds.engine.reduce.reduce_bucket_numel;
  c.step = {ds.micro_batch_size.value_or(1), ds.gradient_accumulation_steps, checkpoint_every};
  if (pr.model.step_fixed()) c.step = {0, 0, -1};
  return c;
}

void print_header(const fit_problem& pr) {
  const gpu_rates& r = pr.machine.rates;
  std::printf("zshard_plan --fit: %s (%.3ge9 parameters, %zu modules) on %d rank(s) (%d node(s) x %d), %s\n",
              pr.model.name.c_str(), double(pr.model.param_count()) / 1e9, pr.model.spec.modules().size(), pr.world(),
              pr.machine.nodes, pr.machine.ranks_per_node, r.description.c_str());
  if (r.device_is_host)
    std::printf("  memory: %.0f GiB host per node (device memory is host memory)", r.host_gib);
  else
    std::printf("  memory: %.1f GiB per device, %.0f GiB host and %.0f GiB NVMe per node", r.device_gib, r.host_gib,
                r.nvme_gib);
  if (pr.model.step_fixed())
    std::printf("; the schedule file's step, %lld tokens per micro-batch and rank\n",
                static_cast<long long>(pr.model.fixed_tokens_per_micro_batch));
  else
    std::printf("; global batch %lld tokens = %lld sequences of %lld, %lld per rank\n",
                static_cast<long long>(pr.global_batch_tokens),
                static_cast<long long>(pr.global_batch_tokens / pr.model.seq_len),
                static_cast<long long>(pr.model.seq_len), static_cast<long long>(pr.sequences_per_rank()));
  std::printf("  rates: GEMM %.4g TFLOP/s x %.2f efficiency, in node %.4g GB/s, across nodes %.4g GB/s, PCIe %.4g GB/s, "
              "NVMe %.4g GB/s per node, HBM %.4g GB/s, host AdamW %.3g G elements/s per rank, latency %.3g us\n\n",
              r.gemm_tflops, r.compute_efficiency, r.intra_node_gbps, r.inter_node_gbps, r.pcie_gbps, r.nvme_gbps,
              r.hbm_gbps, r.host_adam_gelems, r.latency_us);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw usage_error("cannot write '" + path + "'");
}

int fit(const fit_options& o) {
  fit_problem pr;
  // the model
  engine_config base;
  base.param_dtype = dtype::bf16;
  base.partition.persistence_threshold_numel = 100'000;  // DeepSpeed's default: norm gains stay replicated
  std::optional<config::deepspeed_settings> ds;
  std::optional<std::size_t> hidden;  // for the Trainer's "auto" rules of a DeepSpeed config
  std::int64_t default_tokens = 1'048'576;
  if (!o.schedule_path.empty()) {
    std::ifstream in(o.schedule_path);
    if (!in) throw usage_error("cannot read the schedule file '" + o.schedule_path + "'");
    const schedule_file f = read_schedule_file(in, o.schedule_path);
    base = f.cfg;
    const int world = o.ranks_per_node * o.nodes;
    const std::int64_t tokens = o.global_tokens.value_or(default_tokens);
    const int mbs = micro_batches_of(f.schedule.cycle.front());
    if (tokens % (std::int64_t(world) * mbs) != 0)
      throw usage_error("--global-batch-tokens " + std::to_string(tokens) + " does not split into " +
                        std::to_string(world) + " ranks x " + std::to_string(mbs) + " micro-batches");
    pr.model = schedule_fit_model(o.schedule_path, f.spec, f.schedule, tokens / (std::int64_t(world) * mbs));
    pr.global_batch_tokens = tokens;
  } else if (o.model == "gpt-example" && !o.shape) {
    gpt::gpt_config c = main_job_model();
    if (o.seq) c.seq_len = int(*o.seq);
    hidden = std::size_t(c.d_model);
    pr.model = gpt_fit_model(c);
    base.param_dtype = o.type.value_or(dtype::f32);
    base.partition.persistence_threshold_numel = 1024;  // the main job's
    base.reduce.reduce_bucket_numel = 1 << 16;
    default_tokens = std::int64_t(o.ranks_per_node * o.nodes) * 8 * c.seq_len;
  } else {
    transformer_shape s;
    if (o.shape) s = *o.shape;
    else if (auto named = transformer_shape_named(o.model)) s = *named;
    else throw usage_error("unknown model '" + o.model + "' (known: llama3-8b, llama3-70b, llama2-13b, gpt-example)");
    if (o.type) base.param_dtype = *o.type;
    hidden = std::size_t(s.hidden);
    pr.model = llama_fit_model(s, o.seq.value_or(4096), base.param_dtype, o.hooks);
  }
  if (o.type) base.param_dtype = *o.type;
  // the machine
  pr.machine.rates = *gpu_kind_named(o.gpu);
  pr.machine.ranks_per_node = o.ranks_per_node;
  pr.machine.nodes = o.nodes;
  if (o.calibrate) {
    std::printf("calibrating the host backend with %d rank thread(s) ...\n", o.ranks_per_node);
    const host_measurement h = measure_host(o.ranks_per_node, main_job_model());
    pr.machine.rates = host_rates(h, pr.machine.rates);
    std::printf("  GEMM %.2f GFLOP/s, the main job's step %.2f GFLOP/s, AdamW %.3f G elements/s per rank thread, "
                "all_gather %.3f GB/s sent per rank, %.1f us per collective\n",
                h.gemm_gflops, h.model_gflops, h.adam_gelems, h.comm_gbps, h.latency_us);
  }
  apply_rates(pr.machine.rates, o.rates);
  // a DeepSpeed config: the baseline, and the base's precision and hyper-parameters
  if (!o.deepspeed.empty()) {
    ds = config::read_deepspeed_config(o.deepspeed, {.hidden_size = hidden});
    for (const auto& line : ds->messages()) std::fprintf(stderr, "zshard_plan: %s\n", line.c_str());
    base.param_dtype = o.type.value_or(ds->engine.param_dtype);
    base.partition.persistence_threshold_numel = ds->engine.partition.persistence_threshold_numel;
    base.adamw = ds->engine.adamw;
    base.clip_norm = ds->engine.clip_norm;
    base.loss_scale = ds->engine.loss_scale;
    if (!pr.model.step_fixed())
      default_tokens = std::int64_t(pr.machine.world()) * ds->micro_batch_size.value_or(1) *
                       ds->gradient_accumulation_steps * pr.model.seq_len;
  }
  if (!pr.model.step_fixed()) pr.global_batch_tokens = o.global_tokens.value_or(default_tokens);
  pr.base = base;
  pr.top = o.top;
  pr.threads = o.threads;
  pr.exhaustive = o.exhaustive;
  pr.nvme_path = o.nvme_path;
  print_header(pr);

  const fit_result r = fit_search(pr);
  const fit_problem prepared_problem = prepared(pr);
  print_families(r, pr.world());
  std::printf("\n%zu candidates in %zu families: %zu out by their family's floor, %zu by the activation floor; "
              "%zu planned (%zu fit, %zu over capacity, %zu refused); %zu not planned (slower at best); %.2f s\n\n",
              r.entries.size(), r.families.size(), r.count(fit_outcome::family_floor),
              r.count(fit_outcome::activation_floor), r.planned, r.count(fit_outcome::fits),
              r.count(fit_outcome::too_big), r.count(fit_outcome::refused), r.count(fit_outcome::not_planned),
              r.seconds);
  std::optional<fit_entry> baseline;
  if (ds) {
    const fit_candidate bc = candidate_of(*ds, prepared_problem, o.baseline_checkpoint);
    engine_config bcfg = ds->engine;
    bcfg.prefetch.allow_oversized_module = bc.allow_oversized_module;
    if (bc.family.optimizer == fit_optimizer::nvme && bcfg.offload.nvme_path.empty()) bcfg.offload.nvme_path = o.nvme_path;
    baseline = evaluate_candidate(prepared_problem, bc, bcfg);
  }
  const std::int64_t tokens = pr.model.step_fixed()
                                  ? pr.model.fixed_tokens_per_micro_batch *
                                        micro_batches_of(pr.model.fixed->cycle.front()) * pr.world()
                                  : pr.global_batch_tokens;
  if (!r.ranking.empty()) {
    std::printf("the fastest that fit (seconds per step; the terms: docs/fit_time_model.md)\n");
    print_candidate_header();
    // candidates that differ only in a budget that changes neither time nor memory: the first
    std::size_t shown = 0, alike = 0;
    std::vector<const fit_entry*> printed;
    for (std::size_t i = 0; i < r.ranking.size() && int(shown) < pr.top; ++i) {
      const fit_entry& e = r.entries[r.ranking[i]];
      const bool same = std::any_of(printed.begin(), printed.end(), [&](const fit_entry* p) {
        return p->candidate.family == e.candidate.family && p->candidate.step == e.candidate.step &&
               p->time.total == e.time.total && p->device_total == e.device_total;
      });
      if (same) {
        ++alike;
        continue;
      }
      printed.push_back(&e);
      print_candidate(std::to_string(++shown).c_str(), e, tokens);
    }
    if (alike > 0)
      std::printf("    (%zu more alike: larger budgets with the same time and memory, not shown)\n", alike);
    if (baseline) print_candidate("you", *baseline, tokens);
  }
  if (baseline) {
    std::printf("\nyour configuration (%s): stage %d, optimizer on the %s, parameters on the %s, prefetch %zu, "
                "max live %zu, bucket %zu, micro-batch %d x %d, checkpointing %s\n",
                o.deepspeed.c_str(), baseline->candidate.family.stage, to_string(baseline->candidate.family.optimizer),
                tier_short(baseline->candidate.family.params), baseline->candidate.prefetch_numel,
                baseline->candidate.max_live_numel, baseline->candidate.bucket_numel,
                baseline->candidate.step.micro_batch, baseline->candidate.step.accumulation,
                checkpoint_words(baseline->candidate.step.checkpoint_every).c_str());
    if (baseline->plan)
      std::printf("  %s: device %.3f GiB of %.1f (ledger %.3f), host %.1f GiB per node of %.0f, NVMe %.1f GiB per node; "
                  "predicted %.4g s per step (%s)\n",
                  baseline->outcome == fit_outcome::fits ? "fits" : ("does not fit (" + baseline->reason + ")").c_str(),
                  gib(baseline->device_total), pr.machine.rates.device_gib, gib(baseline->plan->device.total_peak),
                  gib(baseline->host_per_node), pr.machine.rates.host_gib, gib(baseline->nvme_per_node),
                  baseline->time.total, baseline->time.dominant());
    else
      std::printf("  refused: %s\n", baseline->reason.c_str());
  }
  const fit_entry* best = r.best();
  if (!best) {
    std::printf("\nnothing fits this machine: see what rules out each family above\n");
    std::printf("\nfit_candidates: %zu\nfit_planned: %zu\nfit_seconds: %.3f\nfit_found: no\n", r.entries.size(),
                r.planned, r.seconds);
    return 1;
  }
  const engine_config cfg = config_of(best->candidate, pr.base, pr.machine, pr.nvme_path);
  const std::string step_words =
      pr.model.step_fixed() ? std::string("the schedule file's step")
                            : "micro-batch " + std::to_string(best->candidate.step.micro_batch) + " x " +
                                  std::to_string(best->candidate.step.accumulation) + " accumulation, checkpointing " +
                                  checkpoint_words(best->candidate.step.checkpoint_every);
  std::printf("\nchosen: %s; prefetch %zu, max live %zu, bucket %zu; %s\n",
              describe(best->candidate.family, pr.world()).c_str(), best->candidate.prefetch_numel,
              best->candidate.max_live_numel, best->candidate.bucket_numel, step_words.c_str());
  if (pr.machine.rates.device_is_host)
    std::printf("  plan: %.3f GiB per rank (device ledger %.3f, peak at %s; host ledger %.3f), %.3f GiB per node of %.0f\n",
                gib(best->device_total + best->plan->host.total_peak), gib(best->plan->device.total_peak),
                best->plan->device.peak_phase.c_str(), gib(best->plan->host.total_peak),
                gib((best->device_total + best->plan->host.total_peak) * std::size_t(pr.machine.ranks_per_node)),
                pr.machine.rates.host_gib);
  else
    std::printf("  plan: device %.3f GiB of %.1f (ledger %.3f, peak at %s); host %.1f GiB per node of %.0f; NVMe %.1f "
                "GiB per node of %.0f\n",
                gib(best->device_total), pr.machine.rates.device_gib, gib(best->plan->device.total_peak),
                best->plan->device.peak_phase.c_str(), gib(best->host_per_node), pr.machine.rates.host_gib,
                gib(best->nvme_per_node), pr.machine.rates.nvme_gib);
  if (baseline && baseline->plan && baseline->time.total > 0)
    std::printf("  predicted %.4g s per step against your configuration's %.4g: %.2fx its speed\n", best->time.total,
                baseline->time.total, baseline->time.total / best->time.total);
  std::printf("\nengine options (C++):\n%s", config::engine_config_cpp(cfg, "cfg", "  ").c_str());
  std::printf("policies: %s", policies_cpp(best->candidate).c_str());
  const bool host_opt = best->candidate.family.optimizer != fit_optimizer::device;
  const config::deepspeed_run run{pr.world(), std::max(1, best->candidate.step.micro_batch),
                                  std::max(1, best->candidate.step.accumulation), host_opt};
  if (!o.write_deepspeed.empty()) {
    write_file(o.write_deepspeed, config::write_deepspeed_config(cfg, run));
    std::printf("wrote %s (a DeepSpeed config of these options)\n", o.write_deepspeed.c_str());
  }
  if (!o.write_cpp.empty()) {
    write_file(o.write_cpp, cpp_file(*best, cfg, describe(best->candidate.family, pr.world())));
    std::printf("wrote %s (the options and policies as C++)\n", o.write_cpp.c_str());
  }
  if (pr.model.main_job) {
    std::string cmd = "02_train_gpt --ranks " + std::to_string(pr.world()) + " --batch " +
                      std::to_string(best->candidate.step.micro_batch) + " --micro " +
                      std::to_string(best->candidate.step.accumulation);
    if (pr.model.seq_len != main_job_model().seq_len) cmd += " --seq " + std::to_string(pr.model.seq_len);
    if (best->candidate.step.checkpoint_every == 0) cmd += " --no-checkpoint";
    if (cfg.param_dtype == dtype::bf16) cmd += " --bf16";
    cmd += " --deepspeed-config " + (o.write_deepspeed.empty() ? std::string("FIT.json") : o.write_deepspeed);
    std::printf("main job: %s%s\n", cmd.c_str(),
                o.write_deepspeed.empty() ? "   (FIT.json: --write-deepspeed-config FIT.json)" : "");
  }
  std::printf("\nfit_candidates: %zu\n", r.entries.size());
  std::printf("fit_planned: %zu\n", r.planned);
  std::printf("fit_seconds: %.3f\n", r.seconds);
  std::printf("fit_found: yes\n");
  std::printf("fit_step_s: %.4g\n", best->time.total);
  std::printf("fit_tokens_per_s: %.6g\n", double(tokens) / best->time.total);
  std::printf("fit_dominant: %s\n", best->time.dominant());
  std::printf("fit_device_gib: %.3f\n", gib(best->device_total));
  std::printf("fit_host_gib_per_node: %.3f\n", gib(best->host_per_node));
  std::printf("fit_nvme_gib_per_node: %.3f\n", gib(best->nvme_per_node));
  if (baseline) {
    std::printf("baseline_fits: %s\n", baseline->outcome == fit_outcome::fits ? "yes" : "no");
    if (baseline->plan) {
      std::printf("baseline_device_gib: %.3f\n", gib(baseline->device_total));
      std::printf("baseline_host_gib_per_node: %.3f\n", gib(baseline->host_per_node));
      std::printf("baseline_step_s: %.4g\n", baseline->time.total);
      std::printf("fit_speedup_vs_baseline: %.3f\n", baseline->time.total / best->time.total);
    }
  }
  return 0;
}

}  // namespace

bool wants_fit(const std::vector<std::string>& args) {
  return std::find(args.begin(), args.end(), "--fit") != args.end();
}

int run_fit(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << fit_usage;
      return 0;
    }
  try {
    return fit(parse(args));
  } catch (const usage_error& e) {
    std::cerr << "zshard_plan: " << e.what() << " (see zshard_plan --fit --help)\n";
    return 2;
  } catch (const error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}

}  // namespace zshard_tools

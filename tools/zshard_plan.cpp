// zshard_plan: each rank's peak memory for a Llama shape under zshard, by ledger category,
// before anything runs (plan/memory_plan.hpp). Defaults are the seed scenario
// (plan/seed_scenario.hpp); every setting can be changed on the command line, and
// --simulate runs the real engine on the phantom backend beside the plan.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "zshard/plan/phantom_run.hpp"
#include "zshard/plan/plan_table.hpp"
#include "zshard/plan/seed_scenario.hpp"
#include "zshard/prefetch/on_demand.hpp"

using namespace zshard;
using namespace zshard::plan;

namespace {

constexpr const char* usage_text = R"(usage: zshard_plan [options]

Plans each rank's peak memory for training a Llama shape with zshard (ZeRO-3), by ledger
category, for the device and (optimizer offloaded) the host. Defaults: the seed scenario.

  --model NAME          llama3-8b | llama3-70b                     (default llama3-70b)
  --world N             data-parallel ranks                        (default 8)
  --device-gib G        device memory per rank: says whether the plan fits
  --micro-batch B       sequences per micro-batch                  (default 1)
  --seq S               tokens per sequence                        (default 4096)
  --micro-batches M     micro-batches per optimizer step           (default 1)
  --checkpoint on|off   activation checkpointing per block         (default on)
  --optimizer device|host  where AdamW state lives                 (default host)
  --dtype bf16|f16|f32  parameter and activation dtype             (default bf16)
  --max-live N          max_live_numel, gathered elements          (default 1e9)
  --prefetch N          prefetch_numel, elements gathered ahead    (default 5e7)
  --bucket N            reduce_bucket_numel                        (default 5e8)
  --prefetcher trace|on-demand                                     (default trace)
  --allow-oversized on|off  a module above --max-live may run alone (default on; the
                        engine's default is off: 70B's embedding and head need it)
  --simulate            also run the engine on the phantom backend (2 steps) and print
                        the run's peaks beside the plan
  --help                this text

Counts take integers or scientific notation (5e8). Exit status: 0 done, 1 the engine would
refuse the configuration, 2 bad command line.
)";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  transformer_shape shape = llama3_70b();
  int world = 8;
  std::optional<double> device_gib;
  activation_options act = seed_scenario{}.activations;
  optimizer_location optimizer = optimizer_location::host;
  prefetch_policy prefetcher = prefetch_policy::trace;
  engine_config cfg = seed_scenario{}.config();
  bool simulate = false;
};

bool on_off(const std::string& flag, const std::string& v) {
  if (v == "on") return true;
  if (v == "off") return false;
  throw usage_error(flag + " takes on or off, not '" + v + "'");
}

double number(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || !std::isfinite(x)) throw usage_error(flag + " takes a number, not '" + v + "'");
  return x;
}

// A positive whole count up to 2^53 (exact in a double), e.g. 500000000 or 5e8.
std::size_t count(const std::string& flag, const std::string& v) {
  const double x = number(flag, v);
  if (x < 1 || x > 9007199254740992.0 || x != std::floor(x))
    throw usage_error(flag + " takes a positive whole count, not '" + v + "'");
  return static_cast<std::size_t>(x);
}

options parse(const std::vector<std::string>& args) {
  options o;
  o.act.micro_batches = 1;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--simulate") {
      o.simulate = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) throw usage_error("unexpected argument '" + a + "'");
    if (i + 1 >= args.size()) throw usage_error(a + " needs a value");
    const std::string& v = args[++i];
    if (a == "--model") {
      auto s = transformer_shape_named(v);
      if (!s) throw usage_error("unknown model '" + v + "' (known: llama3-8b, llama3-70b)");
      o.shape = *s;
    } else if (a == "--world") {
      const std::size_t n = count(a, v);
      if (n > 1'000'000) throw usage_error("--world " + v + " is not a plausible number of ranks");
      o.world = int(n);
    } else if (a == "--device-gib") {
      const double g = number(a, v);
      if (g <= 0) throw usage_error("--device-gib must be positive");
      o.device_gib = g;
    } else if (a == "--micro-batch") {
      o.act.micro_batch = std::int64_t(std::min<std::size_t>(count(a, v), 1u << 31));
    } else if (a == "--seq") {
      o.act.seq_len = std::int64_t(std::min<std::size_t>(count(a, v), 1u << 31));
    } else if (a == "--micro-batches") {
      const std::size_t n = count(a, v);
      if (n > 1000) throw usage_error("--micro-batches " + v + " is more than 1000");
      o.act.micro_batches = int(n);
    } else if (a == "--checkpoint") {
      o.act.checkpoint = on_off(a, v);
    } else if (a == "--optimizer") {
      if (v == "device") o.optimizer = optimizer_location::device;
      else if (v == "host") o.optimizer = optimizer_location::host;
      else throw usage_error("--optimizer takes device or host, not '" + v + "'");
    } else if (a == "--dtype") {
      if (v == "bf16") o.cfg.param_dtype = dtype::bf16;
      else if (v == "f16") o.cfg.param_dtype = dtype::f16;
      else if (v == "f32") o.cfg.param_dtype = dtype::f32;
      else throw usage_error("--dtype takes bf16, f16 or f32, not '" + v + "'");
      o.act.activation_type = o.cfg.param_dtype;
    } else if (a == "--max-live") {
      o.cfg.prefetch.max_live_numel = count(a, v);
    } else if (a == "--prefetch") {
      o.cfg.prefetch.prefetch_numel = count(a, v);
    } else if (a == "--bucket") {
      o.cfg.reduce.reduce_bucket_numel = count(a, v);
    } else if (a == "--prefetcher") {
      if (v == "trace") o.prefetcher = prefetch_policy::trace;
      else if (v == "on-demand") o.prefetcher = prefetch_policy::on_demand;
      else throw usage_error("--prefetcher takes trace or on-demand, not '" + v + "'");
    } else if (a == "--allow-oversized") {
      o.cfg.prefetch.allow_oversized_module = on_off(a, v);
    } else {
      throw usage_error("unknown option '" + a + "'");
    }
  }
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
phantom_result simulate(const options& o, const transformer_model& m, const step_schedule& s) {
  if (o.prefetcher == prefetch_policy::trace)
    return run_phantom<tool_policies<Offloader, prefetch::trace>>(m.spec, o.cfg, o.world, s, 2);
  return run_phantom<tool_policies<Offloader, prefetch::on_demand>>(m.spec, o.cfg, o.world, s, 2);
}

double gib(std::size_t bytes) { return double(bytes) / double(std::size_t{1} << 30); }

int run(const options& o) {
  const transformer_model model = build_transformer(o.shape);
  const step_schedule schedule = transformer_schedule(model, o.act);
  const memory_plan plan = plan_memory(model.spec, o.cfg, o.world, schedule, {.optimizer = o.optimizer, .prefetcher = o.prefetcher});
  std::printf("%s: %.2fe9 parameters, %d layers, hidden %lld; %d ranks, %s, optimizer on the %s\n",
              o.shape.name.c_str(), double(o.shape.param_count()) / 1e9, o.shape.layers,
              static_cast<long long>(o.shape.hidden), o.world, std::string(to_string(o.cfg.param_dtype)).c_str(),
              o.optimizer == optimizer_location::host ? "host" : "device");
  std::printf("micro-batch %lld x %lld tokens, %d per step, checkpointing %s; max_live %zu, prefetch %zu (%s), bucket %zu\n\n",
              static_cast<long long>(o.act.micro_batch), static_cast<long long>(o.act.seq_len), o.act.micro_batches,
              o.act.checkpoint ? "on" : "off", o.cfg.prefetch.max_live_numel, o.cfg.prefetch.prefetch_numel,
              o.prefetcher == prefetch_policy::trace ? "trace" : "on-demand", o.cfg.reduce.reduce_bucket_numel);
  std::optional<phantom_result> sim;
  if (o.simulate)
    sim = o.optimizer == optimizer_location::host ? simulate<offload::host_adam>(o, model, schedule)
                                                  : simulate<offload::on_device>(o, model, schedule);
  print_plan(std::cout, plan, sim ? &sim->peak_step() : nullptr, sim && sim->host ? &*sim->host : nullptr);
  std::printf("\npeak_gib_per_rank: %.3f\n", gib(plan.device.total_peak));
  std::printf("peak_phase: %s\n", plan.device.peak_phase.c_str());
  std::printf("host_gib_per_rank: %.3f\n", gib(plan.host.total_peak));
  if (sim) std::printf("simulated_peak_gib: %.3f\n", gib(sim->peak()));
  if (o.device_gib) {
    const auto budget = static_cast<std::size_t>(*o.device_gib * double(std::size_t{1} << 30));
    std::printf("fits: %s (%.3f of %.3f GiB)\n", plan.fits(budget) ? "yes" : "no", gib(plan.device.total_peak), *o.device_gib);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
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

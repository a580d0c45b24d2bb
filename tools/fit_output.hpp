#pragma once
// What zshard_plan --fit prints (tools/zshard_fit.cpp): the families and what ruled each out,
// the fastest candidates with every term of their predicted step time, and for the chosen one
// the engine options as C++, the Offloader, the main job's command line and the key figures.
#include <cstdio>
#include <string>

#include "zshard/config/config_cpp.hpp"
#include "zshard/plan/fit_search.hpp"

namespace zshard_tools {

using namespace zshard::plan;

inline double gib(std::size_t b) { return double(b) / double(std::size_t{1} << 30); }

// 234881024 -> "235M", 1000000000 -> "1G", 0 -> "0".
inline std::string compact(std::size_t n) {
  char buf[32];
  if (n >= 1'000'000'000 && n % 1'000'000'000 == 0) std::snprintf(buf, sizeof buf, "%zuG", n / 1'000'000'000);
  else if (n >= 1'000'000'000) std::snprintf(buf, sizeof buf, "%.2fG", double(n) / 1e9);
  else if (n >= 1'000'000) std::snprintf(buf, sizeof buf, "%.0fM", double(n) / 1e6);
  else if (n >= 1'000) std::snprintf(buf, sizeof buf, "%.0fK", double(n) / 1e3);
  else std::snprintf(buf, sizeof buf, "%zu", n);
  return buf;
}

inline const char* tier_short(zshard::offload_tier t) { return t == zshard::offload_tier::host ? "host" : "device"; }

inline void print_families(const fit_result& r, int world) {
  std::printf("families (stage, optimizer, parameters, shard group) and what rules each out:\n");
  for (const auto& f : r.families)
    std::printf("  %d %-6s %-6s %5d  %s\n", f.family.stage, to_string(f.family.optimizer), tier_short(f.family.params),
                f.family.shard_group, f.verdict.c_str());
  (void)world;
}

inline void print_candidate_header() {
  std::printf("%3s %5s %-6s %-6s %5s %6s %6s %6s %8s %-7s %8s %9s %9s %9s %10s %8s %8s %8s %8s %8s %8s %8s %8s %8s  %s\n",
              "#", "stage", "optim", "params", "group", "pref", "live", "bucket", "mb x acc", "ckpt", "dev GiB",
              "host/node", "nvme/node", "step s", "tokens/s", "compute", "recomp", "gather", "reduce", "across", "pcie",
              "nvme", "optim", "exposed", "dominant");
}

inline void print_candidate(const char* label, const fit_entry& e, std::int64_t tokens_per_step) {
  const fit_candidate& c = e.candidate;
  const step_time_terms& t = e.time;
  char shape[32], ck[24];
  if (c.step.micro_batch > 0) std::snprintf(shape, sizeof shape, "%d x %d", c.step.micro_batch, c.step.accumulation);
  else std::snprintf(shape, sizeof shape, "file");
  if (c.step.checkpoint_every < 0) std::snprintf(ck, sizeof ck, "file");
  else if (c.step.checkpoint_every == 0) std::snprintf(ck, sizeof ck, "none");
  else if (c.step.checkpoint_every == 1) std::snprintf(ck, sizeof ck, "every");
  else std::snprintf(ck, sizeof ck, "1/%d", c.step.checkpoint_every);
  std::printf("%3s %5d %-6s %-6s %5d %6s %6s %6s %8s %-7s %8.2f %9.1f %9.1f %9.3f %10.0f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f "
              "%8.3f %8.3f %8.3f  %s\n",
              label, c.family.stage, to_string(c.family.optimizer), tier_short(c.family.params), c.family.shard_group,
              compact(c.prefetch_numel).c_str(), compact(c.max_live_numel).c_str(), compact(c.bucket_numel).c_str(),
              shape, ck, gib(e.device_total), gib(e.host_per_node), gib(e.nvme_per_node), t.total,
              t.total > 0 ? double(tokens_per_step) / t.total : 0.0, t.compute, t.recompute, t.gather, t.reduce,
              t.across, t.pcie, t.nvme, t.optimizer, t.exposed, t.dominant());
}

// The Offloader a candidate needs, as a policies type.
inline std::string policies_cpp(const fit_candidate& c) {
  if (c.family.optimizer == fit_optimizer::device) return "zshard::default_policies  // offload::on_device\n";
  return "struct fit_policies : zshard::default_policies {\n  using offloader = zshard::offload::host_adam;\n};\n";
}

// A translation unit that compiles: the chosen configuration as a function and its policies.
inline std::string cpp_file(const fit_entry& e, const zshard::engine_config& cfg, const std::string& what) {
  std::string s = "// zshard_plan --fit: " + what + "\n#include <zshard/zshard.hpp>\n\n";
  if (e.candidate.family.optimizer != fit_optimizer::device) s += policies_cpp(e.candidate) + "\n";
  s += "inline zshard::engine_config fit_engine_config() {\n";
  s += zshard::config::engine_config_cpp(cfg, "cfg", "  ");
  s += "  return cfg;\n}\n";
  return s;
}

}  // namespace zshard_tools

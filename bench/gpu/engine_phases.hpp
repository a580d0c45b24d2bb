#pragma once
// bench_gpu's stage 3b: where the host spends one engine step, from the engine's own trace
// (engine_config::trace, trace/trace_sink.hpp). Part of bench_gpu.cu's translation unit.
#include <cstdio>
#include <map>
#include <string>

#include "zshard/trace/rank_trace.hpp"

// Host time per engine phase in the traced step (rank 0): every span the engine records, by
// category, and the user's scopes (its kernel launches, here the synthetic compute and the
// gradient fills). Returns the engine's own host time (everything but the scopes), in ms.
inline double print_phases(const zshard::rank_trace& t, double step_ms) {
  struct total {
    int calls = 0;
    double us = 0;
  };
  std::map<std::string, total> by;
  for (const auto& e : t.events()) {
    if (e.phase != 'X') continue;
    const std::string key = std::string(e.category) == "scope" ? "scope (user kernels, launches)"
                            : std::string(e.category) == "optimizer" || std::string(e.category) == "wait"
                                ? std::string(e.category) + ": " + e.name
                                : std::string(e.category);
    by[key].calls++;
    by[key].us += e.dur_us;
  }
  std::printf("\n3b. host time of one engine step by phase (overlap on, rank 0, traced; step %.2f ms)\n%-78s %6s %9s\n",
              step_ms, "phase", "calls", "host ms");
  double engine_ms = 0;
  for (const auto& [k, v] : by) {
    std::printf("%-78s %6d %9.3f\n", k.c_str(), v.calls, v.us / 1e3);
    if (!k.starts_with("scope")) engine_ms += v.us / 1e3;
  }
  return engine_ms;
}


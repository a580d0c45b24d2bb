// The engine's own bookkeeping per scope and per module, and how it grows with the model:
// 500, 5,000 and 50,000 modules of two small parameters (bench/engine_overhead_run.hpp: phantom
// backend, 8 virtual ranks, default policies; no math, no copies, no communication). Question:
// is the cost per module constant from a small model to one with the seed's module count and
// more, and is a scope no dearer than it was at an older commit (ZSHARD_BENCH_OLD_COMMIT,
// d43b7cf by default), measured in the same run?
//
// Figures are CPU time of the bench's thread (CLOCK_THREAD_CPUTIME_ID), so the time the
// scheduler gives other processes on a shared machine is not counted; caches and memory
// bandwidth they take still are. Each figure is the best of several runs, the builds interleaved.
//
// Usage: engine_overhead [--quick]. Prints a table, then the key figures as `name: value`.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine_overhead_run.hpp"

#ifdef ZSHARD_BENCH_OLD_NAMESPACE
namespace ZSHARD_BENCH_OLD_NAMESPACE::bench {
engine_overhead_figures run_engine_overhead_old(int modules, int micro_batches);  // engine_overhead_old.cpp
}
#endif

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

engine_overhead_figures best_of(const engine_overhead_figures& a, const engine_overhead_figures& b) {
  return {std::min(a.forward_ns, b.forward_ns), std::min(a.backward_ns, b.backward_ns), std::min(a.ends_ns, b.ends_ns),
          std::min(a.step_ns, b.step_ns)};
}

struct build {
  const char* name;
  engine_overhead_figures (*run)(int, int);
  std::vector<engine_overhead_figures> best;  // per size
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::vector<int> sizes = {500, 5000, 50000};
  const int rounds = quick ? 2 : 5;
  std::vector<build> builds = {{"this tree", &zshard::bench::run_engine_overhead, {}}};
#ifdef ZSHARD_BENCH_OLD_NAMESPACE
  builds.push_back({ZSHARD_BENCH_OLD_COMMIT, &ZSHARD_BENCH_OLD_NAMESPACE::bench::run_engine_overhead_old, {}});
#endif
  const engine_overhead_figures none{1e300, 1e300, 1e300, 1e300};
  for (auto& b : builds) b.best.assign(sizes.size(), none);
  // Interleaved: each round runs every size on every build, so a slow spell of the machine
  // touches all of them alike; the builds in turn first (a fixed order gives each the same
  // predecessor, and with it the same cache and allocator state, every round).
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < builds.size(); ++j) {
        auto& b = builds[(j + static_cast<std::size_t>(r)) % builds.size()];
        const int micro_batches = std::max(3, 200'000 / sizes[i]);
        b.best[i] = best_of(b.best[i], b.run(sizes[i], micro_batches));
      }

  std::printf("engine bookkeeping, ns per module (2 parameters each; phantom backend, 8 ranks, default policies)\n");
  std::printf("CPU: %s; thread CPU time, best of %d interleaved rounds\n\n", cpu_model().c_str(), rounds);
  std::printf("%9s  %-10s %9s %9s %13s %9s %11s %9s\n", "modules", "headers", "forward", "backward", "begin+end_bw",
              "per_mod", "step/module", "growth");
  for (auto& b : builds)
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto& f = b.best[i];
      std::printf("%9d  %-10s %9.1f %9.1f %13.1f %9.1f %11.1f %9.2f\n", sizes[i], b.name, f.forward_ns, f.backward_ns,
                  f.ends_ns, f.per_module_ns(), f.step_ns, f.per_module_ns() / b.best[0].per_module_ns());
    }
  std::printf(
      "\nforward / backward: one scope opened and closed; begin+end_bw: begin_backward() + end_backward() (the\n"
      "Reducer's flush of every gradient) per module; per_mod: the three, a micro-batch per module; step/module:\n"
      "step() per module (runs once per optimizer step); growth: per_mod over per_mod at %d modules.\n\n",
      sizes.front());

  const auto& now = builds.front().best;
  std::printf("engine_forward_scope_ns: %.1f\n", now.front().forward_ns);
  std::printf("engine_backward_scope_ns: %.1f\n", now.front().backward_ns);
  std::printf("engine_per_module_ns_%d: %.1f\n", sizes.back(), now.back().per_module_ns());
  std::printf("engine_per_module_growth: %.2f\n", now.back().per_module_ns() / now.front().per_module_ns());
  // The bound: the largest over the smallest of the sizes, per scope (forward, backward),
  // the end of backward per module, and the sum; the worst of them.
  double worst = 0;
  for (double engine_overhead_figures::*f :
       {&engine_overhead_figures::forward_ns, &engine_overhead_figures::backward_ns,
        &engine_overhead_figures::ends_ns}) {
    double lo = 1e300, hi = 0;
    for (const auto& s : now) lo = std::min(lo, s.*f), hi = std::max(hi, s.*f);
    worst = std::max(worst, hi / lo);
  }
  std::printf("engine_worst_growth: %.2f\n", worst);
  std::printf("engine_step_per_module_growth: %.2f\n", now.back().step_ns / now.front().step_ns);
  if (builds.size() > 1) {
    const auto& old = builds.back().best;
    // this tree over the old headers, per scope (in cache: the smallest model) and per module
    std::printf("engine_forward_scope_vs_%s: %.2f\n", builds.back().name,
                now.front().forward_ns / old.front().forward_ns);
    std::printf("engine_backward_scope_vs_%s: %.2f\n", builds.back().name,
                now.front().backward_ns / old.front().backward_ns);
    std::printf("engine_per_module_vs_%s_%d: %.2f\n", builds.back().name, sizes.back(),
                now.back().per_module_ns() / old.back().per_module_ns());
    std::printf("engine_per_module_growth_%s: %.2f\n", builds.back().name,
                old.back().per_module_ns() / old.front().per_module_ns());
  }
  return 0;
}

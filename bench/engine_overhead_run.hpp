#pragma once
// One measurement of the engine's own bookkeeping (bench/engine_overhead.cpp), written once and
// compiled twice: against this tree's headers and, in engine_overhead_old.cpp, against the
// headers of an older commit with the namespace renamed (-Dzshard=zshard_<commit>), so both
// engines run side by side in one process without sharing a symbol.
//
// The model: `modules` modules of two small parameters (64 x 64 and 64), bf16, 8 virtual ranks
// on the phantom backend (no math, no copies, no communication: only the engine's work). One
// micro-batch is the forward of every module in order, begin_backward(), the backward of every
// module in reverse, end_backward(); step() runs once per micro-batch and is timed apart.
#include <time.h>

#include <cstddef>
#include <string>

#include "engine_overhead_figures.hpp"
#include "many_small_modules.hpp"
#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/engine/default_policies.hpp"
#include "zshard/engine/engine.hpp"

namespace zshard::bench {

// `micro_batches` timed micro-batches after two warm-up ones (the first records the prefetch
// trace). Built per call: the engine and its model are part of what a size costs in cache.
inline engine_overhead_figures run_engine_overhead(int modules, int micro_batches) {
  const model_spec spec = many_small_modules(modules);
  engine_config cfg;
  cfg.param_dtype = dtype::bf16;
  phantom_backend backend;
  null_comm comm(0, 8);
  engine<phantom_backend, null_comm> eng(backend, comm, spec, cfg);
  // CPU time of this thread: time the scheduler gave to other processes is not counted, so
  // the figures hold on a shared machine (caches the others evict still cost).
  const auto now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
  };
  double fwd = 0, bwd = 0, ends = 0, stp = 0;
  const std::size_t n = spec.modules().size();
  for (int s = -2; s < micro_batches; ++s) {
    const double t0 = now();
    for (module_id m = 0; m < n; ++m) eng.forward(m).close();
    const double t1 = now();
    eng.begin_backward();
    const double t2 = now();
    for (module_id m = n; m-- > 0;) eng.backward(m).close();
    const double t3 = now();
    eng.end_backward();
    const double t4 = now();
    eng.step();
    const double t5 = now();
    if (s >= 0) {
      fwd += t1 - t0;
      bwd += t3 - t2;
      ends += (t2 - t1) + (t4 - t3);
      stp += t5 - t4;
    }
  }
  const double per = double(n) * double(micro_batches);
  return {fwd / per, bwd / per, ends / per, stp / per};
}

}  // namespace zshard::bench

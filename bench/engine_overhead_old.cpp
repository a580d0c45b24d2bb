// engine_overhead's measurement compiled against the headers of an older commit (the build
// extracts them with `git archive`; bench/CMakeLists.txt), with the namespace renamed on the
// command line (-Dzshard=zshard_<commit>), so that this engine and the current one live side by
// side in one program: bench/engine_overhead.cpp calls both in one run.
#include "engine_overhead_run.hpp"

namespace zshard::bench {
// Out of line, for engine_overhead.cpp to call (the measurement itself is inline).
engine_overhead_figures run_engine_overhead_old(int modules, int micro_batches) {
  return run_engine_overhead(modules, micro_batches);
}
}  // namespace zshard::bench

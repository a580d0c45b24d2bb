#pragma once
// What one engine_overhead measurement returns (bench/engine_overhead_run.hpp); no zshard
// header here, so both the current and the old-headers translation units can share it.

// Nanoseconds per module, averaged over the timed micro-batches.
struct engine_overhead_figures {
  double forward_ns = 0;   // forward scope open + close
  double backward_ns = 0;  // backward scope open + close
  double ends_ns = 0;      // begin_backward() + end_backward(), divided by the modules
  double step_ns = 0;      // step(), divided by the modules (two parameters each)
  double per_module_ns() const { return forward_ns + backward_ns + ends_ns; }
};

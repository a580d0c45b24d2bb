#pragma once
// Checks a user can run in their own doctest suite to verify an integration with zshard:
//
//   #include <zshard/testing/invariants.hpp>
//   #include <doctest/doctest.h>          // either order

//   ...
//   eng.step();
//   ZSHARD_CHECK_STEP_INVARIANTS(eng);                // I2-I6 at the step boundary
//   CHECK(zshard::testing::memory_bound_violations(eng).empty());
//
// and, for equality with single-process training, zshard::testing::max_relative_difference()
// over the parameters gathered from a sharded run and a world-size-1 run of the same loop.
// Each check returns human-readable violations instead of asserting, so it also serves tests
// that are not written with doctest.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "zshard/core/memory_ledger.hpp"
#include "zshard/model/model_spec.hpp"

namespace zshard::testing {

// What must hold right after step(): nothing open, pending, gathered or waiting (I2-I4), the
// resident figure derived from the gathered set agrees with a scan (I5), the Reducer is empty
// (I6), and the ledger holds no gathered parameters or full gradients.
template <class Engine>
std::vector<std::string> step_boundary_violations(const Engine& eng) {
  std::vector<std::string> v;
  const auto& spec = eng.spec();
  if (eng.open_scopes() != 0) v.push_back(std::to_string(eng.open_scopes()) + " module scope(s) open");
  for (module_id m = 0; m < spec.modules().size(); ++m)
    if (eng.tracker().pending_uses(m) != 0)
      v.push_back("module '" + spec.module(m).name + "' has " + std::to_string(eng.tracker().pending_uses(m)) +
                  " counted use(s) pending (I1/I2)");
  std::size_t scanned = 0;
  for (param_id p = 0; p < spec.params().size(); ++p) {
    const auto& s = eng.store()[p];
    if (s.gathered()) {
      scanned += s.layout.padded_numel;
      v.push_back("parameter '" + spec.param(p).name + "' still gathered (I4)");
    }
    if (s.full_grad) v.push_back("parameter '" + spec.param(p).name + "' still holds a full gradient (I3)");
    if (eng.residency_state().pins(p) != 0 || eng.residency_state().holds(p) != 0)
      v.push_back("parameter '" + spec.param(p).name + "' still pinned or held (I2)");
  }
  if (scanned != eng.resident_numel()) v.push_back("resident elements by scan and by set disagree (I5)");
  if (eng.reducer().pending_numel() != 0) v.push_back("the Reducer still has gradients pending (I6)");
  const memory_ledger& l = eng.ledger();
  if (l.current(mem_category::gathered_params) != 0) v.push_back("ledger: gathered_params not zero after step (I4)");
  if (l.current(mem_category::grad_buckets) != 0) v.push_back("ledger: grad_buckets not zero after step (I6)");
  return v;
}

// Peak bounds read from the ledger since its last reset_peaks(): gathered parameters within
// max_live_numel at the widest gathered dtype (I5; the largest module alone when
// allow_oversized_module), full gradients within I6's bound:
//   4 bytes × ( max(reduce_bucket_numel, the largest trainable parameter)   the Reducer's bucket
//             + the gradients that wait for a later use's backward: trainable parameters shared
//               by several modules, and those of modules with several counted uses pending
//               at once (the HookTracker says which, when it is track::use_counter)
//             + the largest D modules' gradients, D = the deepest nesting of backward scopes
//               (1 unless backward scopes nest) )
//             + one staging pack of small replicated gradients, at most
//               reduce.replicated_pack_numel elements (the Reducer all-reduces it once)
// Replicated parameters count like the others.
// A tracker that does not report uses and nesting gets the bound that assumes every gradient
// may wait. It never fires on a correct run; a Reducer that copies its bucket (the regression
// I6 exists for) breaks it.
// Once gradient sync was off (engine::set_gradient_sync), every trainable parameter's full
// gradient may have waited: no-sync accumulation holds them until a synced micro-batch.
template <class Engine>
std::vector<std::string> memory_bound_violations(const Engine& eng) {
  std::vector<std::string> v;
  const auto& spec = eng.spec();
  const auto& cfg = eng.config();
  const auto& tracker = eng.tracker();
  using tracker_type = std::remove_cvref_t<decltype(tracker)>;
  constexpr bool knows_uses = requires(const tracker_type& t, module_id m) {
    t.max_pending_uses(m);
    t.max_backward_depth();
  };
  std::size_t widest_elem = 0, largest_module = 0, largest_param = 0;
  std::vector<std::size_t> module_grads;
  std::vector<int> listed(spec.params().size(), 0);
  std::vector<bool> waits(spec.params().size(), !knows_uses);
  for (module_id m = 0; m < spec.modules().size(); ++m) {
    std::size_t n = 0, g = 0;
    for (param_id p : spec.module(m).params) {
      const auto& l = eng.layout(p);
      ++listed[p];
      if (spec.param(p).trainable) {
        g += l.padded_numel;
        largest_param = std::max(largest_param, l.padded_numel);
        if constexpr (knows_uses)
          if (tracker.max_pending_uses(m) > 1) waits[p] = true;
      }
      if (l.replicated) continue;
      n += l.padded_numel;
      widest_elem = std::max(widest_elem, size_of(spec.param(p).type.value_or(cfg.param_dtype)));
    }
    largest_module = std::max(largest_module, n);
    module_grads.push_back(g);
  }
  const std::size_t live_numel = cfg.prefetch.allow_oversized_module
                                     ? std::max(cfg.prefetch.max_live_numel, largest_module)
                                     : cfg.prefetch.max_live_numel;
  const memory_ledger& l = eng.ledger();
  if (l.peak(mem_category::gathered_params) > live_numel * widest_elem)
    v.push_back("gathered parameters peaked at " + std::to_string(l.peak(mem_category::gathered_params)) +
                " bytes, above max_live_numel (I5)");
  std::size_t waiting = 0;
  for (param_id p = 0; p < spec.params().size(); ++p)
    if (spec.param(p).trainable && (waits[p] || listed[p] > 1)) waiting += eng.layout(p).padded_numel;
  std::size_t depth = module_grads.size();
  if constexpr (knows_uses) depth = std::size_t(std::max(tracker.max_backward_depth(), 1));
  std::sort(module_grads.rbegin(), module_grads.rend());
  std::size_t open_grads = 0;
  for (std::size_t i = 0; i < depth && i < module_grads.size(); ++i) open_grads += module_grads[i];
  // The Reducer's one staging pack of small replicated gradients (reduce/bucketed.hpp).
  std::size_t packable = 0;
  for (param_id p = 0; p < spec.params().size(); ++p)
    if (spec.param(p).trainable && eng.layout(p).replicated && eng.layout(p).numel <= cfg.reduce.replicated_pack_numel)
      packable += eng.layout(p).numel;
  const std::size_t pack = std::min(packable, cfg.reduce.replicated_pack_numel);
  if constexpr (requires { eng.gradient_sync_was_off(); })
    if (eng.gradient_sync_was_off())
      for (param_id p = 0; p < spec.params().size(); ++p)
        if (spec.param(p).trainable && !(waits[p] || listed[p] > 1)) waiting += eng.layout(p).padded_numel;
  const std::size_t bucket_bound =
      (std::max(cfg.reduce.reduce_bucket_numel, largest_param) + waiting + open_grads + pack) * sizeof(float);
  if (l.peak(mem_category::grad_buckets) > bucket_bound)
    v.push_back("full gradients peaked at " + std::to_string(l.peak(mem_category::grad_buckets)) +
                " bytes, above one bucket, the gradients waiting for later uses and those of the open backward "
                "scopes = " +
                std::to_string(bucket_bound) + " (I6)");
  return v;
}

// Largest normwise relative difference between two sets of parameters (e.g. gathered after a
// sharded run and after a world-size-1 run of the same loop); single-process training equality
// in f32 is expected within about 1e-5.
inline double max_relative_difference(const std::vector<std::vector<float>>& a,
                                      const std::vector<std::vector<float>>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (std::size_t p = 0; p < a.size() && p < b.size(); ++p) {
    if (a[p].size() != b[p].size()) return INFINITY;
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < a[p].size(); ++i) {
      diff += (double(a[p][i]) - b[p][i]) * (double(a[p][i]) - b[p][i]);
      norm += double(b[p][i]) * b[p][i];
    }
    worst = std::max(worst, norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff));
  }
  return worst;
}

}  // namespace zshard::testing

// doctest-flavoured wrappers. They are macros, so doctest may be included before or after this
// header; the file that uses them must include <doctest/doctest.h> (else the compiler stops at
// ZSHARD_TESTING_NEEDS_DOCTEST's message below).
#define ZSHARD_TESTING_NEEDS_DOCTEST \
  static_assert(sizeof(DOCTEST_VERSION_STR), "zshard: #include <doctest/doctest.h> to use ZSHARD_CHECK_*")
#define ZSHARD_CHECK_STEP_INVARIANTS(eng)                                                   \
  do {                                                                                      \
    ZSHARD_TESTING_NEEDS_DOCTEST;                                                           \
    for (const auto& zshard_violation : ::zshard::testing::step_boundary_violations(eng))   \
      FAIL_CHECK(zshard_violation);                                                         \
  } while (0)
#define ZSHARD_CHECK_MEMORY_BOUNDS(eng)                                                     \
  do {                                                                                      \
    ZSHARD_TESTING_NEEDS_DOCTEST;                                                           \
    for (const auto& zshard_violation : ::zshard::testing::memory_bound_violations(eng))    \
      FAIL_CHECK(zshard_violation);                                                         \
  } while (0)

#pragma once
// The ledgers a plan reads like (plan/plan_walk.hpp fills them): the device ledger the walk
// charges event by event, remembering where its total peaked, and the host ledger of an
// Offloader that keeps the optimizer state on the host (held whole from construction on).
#include <cstddef>
#include <string>
#include <vector>

#include "zshard/core/memory_ledger.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/partitioner.hpp"
#include "zshard/plan/plan_result.hpp"

namespace zshard::plan::detail {

// A point of the walk; the phase text is built once, from the peak's point, at the end.
struct walk_point {
  int step = -1;
  std::size_t program = 0, event = 0;
  // 0: the event, 1: reduce-scatter of `param`, 2: initialization, 3: step(), 4: end of backward,
  // 5: a control call's argument check after the event (before the step's first: event = npos)
  int what = 0;
  param_id param = 0;
};

class walk_ledger {
 public:
  void charge(mem_category c, std::size_t bytes, const walk_point& at) {
    ledger_.charge(c, bytes);
    if (ledger_.total_peak() > peak_seen_) {
      peak_seen_ = ledger_.total_peak();
      peak_at_ = at;
    }
  }
  void release(mem_category c, std::size_t bytes) { ledger_.release(c, bytes); }
  void transient(mem_category c, std::size_t bytes, const walk_point& at) {
    charge(c, bytes, at);
    ledger_.release(c, bytes);
  }
  // Category c holds `bytes` from now on.
  void set(mem_category c, std::size_t bytes, const walk_point& at) {
    const std::size_t now = ledger_.current(c);
    if (bytes > now)
      charge(c, bytes - now, at);
    else
      ledger_.release(c, now - bytes);
  }

  // `describe(point)`: the phase text of the peak.
  template <class Describe>
  ledger_plan result(const std::string& name, Describe&& describe) const {
    ledger_plan r;
    r.name = name;
    for (std::size_t i = 0; i < mem_category_count; ++i) {
      r.peak[i] = ledger_.peak(mem_category(i));
      r.at_total_peak[i] = ledger_.at_total_peak(mem_category(i));
    }
    r.total_peak = ledger_.total_peak();
    r.peak_phase = describe(peak_at_);
    return r;
  }

 private:
  memory_ledger ledger_{"device (plan)"};
  walk_point peak_at_{};
  std::size_t peak_seen_ = 0;
};

}  // namespace zshard::plan::detail

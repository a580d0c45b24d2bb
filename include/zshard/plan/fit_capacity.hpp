#pragma once
// The fit's floors and capacity checks (plan/fit_search.hpp): what a plan holds against what a
// machine has, in words that name the terms that do not fit; the family floor (the terms held
// all run) and the step every family floor is planned on.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "zshard/plan/fit_candidate.hpp"
#include "zshard/plan/gpu_rates.hpp"
#include "zshard/plan/plan_result.hpp"
#include "zshard/plan/schedule.hpp"

namespace zshard::plan::detail {

inline double gib_of(std::size_t bytes) { return double(bytes) / double(std::size_t{1} << 30); }

inline std::string gib_text(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", gib_of(bytes));
  return buf;
}

// The categories of a ledger plan from largest to smallest, as "optimizer_state 98.6 + ...".
inline std::string largest_terms(const std::array<std::size_t, mem_category_count>& by, int n) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < mem_category_count; ++i)
    if (by[i] >= (std::size_t{1} << 26)) idx.push_back(i);  // 0.1 GiB and more: what the words round to
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return by[a] > by[b]; });
  std::string s;
  for (std::size_t k = 0; k < idx.size() && int(k) < n; ++k)
    s += (k ? ", " : "") + std::string(to_string(mem_category(idx[k]))) + " " + gib_text(by[idx[k]]);
  return s;
}

// A step of one forward and backward of the first module with parameters: what the family's
// floor plan walks (the terms it reads do not depend on the step).
inline step_program minimal_program(const model_spec& spec) {
  module_id first = 0;
  for (module_id m = 0; m < spec.modules().size(); ++m)
    if (!spec.module(m).params.empty()) {
      first = m;
      break;
    }
  step_program p;
  p.name = "family floor";
  p.events = {schedule_event::open(first, scope_kind::forward), schedule_event::close(first, scope_kind::forward),
              schedule_event::begin_backward(),
              schedule_event::open(first, scope_kind::backward),
              schedule_event::close(first, scope_kind::backward),
              schedule_event::end_backward()};
  return p;
}

inline std::size_t largest_activation(const step_program& p) {
  std::size_t a = 0;
  for (const auto& e : p.events)
    if (e.kind == event_kind::activations) a = std::max(a, e.bytes);
  return a;
}


// What fits where: the device total against the device (the host backend: device and host
// ledgers of every rank of a node against the node's memory), the host ledger of a node
// against its memory, the NVMe files against the drives. Empty when everything fits.
inline std::string over_capacity(const memory_plan& p, const fit_machine& m, bool floor_only = false) {
  const std::size_t host_node = host_bytes_per_node(p, m), nvme_node = nvme_bytes_per_node(p, m);
  if (m.rates.device_is_host) {
    const std::size_t node = (p.device_total() + p.host.total_peak) * std::size_t(m.ranks_per_node);
    if (node > m.host_bytes_per_node())
      return "host memory " + gib_text(node) + " GiB per node > " + gib_text(m.host_bytes_per_node()) + " (" +
             largest_terms(p.device.at_total_peak, 3) + (floor_only ? " per rank, held all run)" : " per rank)");
  } else {
    if (p.device_total() > m.device_bytes())
      return std::string("device ") + gib_text(p.device_total()) + " GiB > " + gib_text(m.device_bytes()) + " (" +
             largest_terms(floor_only ? p.device.peak : p.device.at_total_peak, 3) +
             (floor_only ? ", held all run)" : " at " + p.device.peak_phase + ")");
    if (host_node > m.host_bytes_per_node())
      return "host " + gib_text(host_node) + " GiB per node > " + gib_text(m.host_bytes_per_node()) + " (" +
             largest_terms(p.host.peak, 3) + " per rank)";
  }
  if (nvme_node > m.nvme_bytes_per_node())
    return "NVMe " + gib_text(nvme_node) + " GiB per node > " + gib_text(m.nvme_bytes_per_node());
  return {};
}

// The family floor as a plan: its device ledger reduced to the terms held all run.
inline memory_plan floor_of(memory_plan p) {
  std::array<std::size_t, mem_category_count> held{};
  for (mem_category c : {mem_category::sharded_params, mem_category::optimizer_state, mem_category::grad_shards})
    held[std::size_t(c)] = p.device.peak_of(c);
  p.device.peak = p.device.at_total_peak = held;
  p.device.total_peak = 0;
  for (auto x : held) p.device.total_peak += x;
  return p;
}


}  // namespace zshard::plan::detail

#pragma once
// A memory plan as a table, one row per ledger category: the predicted peak of each category
// and the categories at the moment of the total peak, optionally beside a run's ledger (its
// peaks and the plan's error on the total), for the device and, when state is offloaded, the
// host and the NVMe files, with the bytes a step moves between them.
#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>

#include "zshard/core/memory_ledger.hpp"
#include "zshard/plan/memory_plan.hpp"

namespace zshard::plan {

namespace detail {

inline std::string cell(const std::string& s, std::size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

// Bytes in the unit of the table (2^shift bytes), three decimals.
inline std::string in_unit(std::size_t bytes, int shift) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", double(bytes) / double(std::size_t{1} << shift));
  return buf;
}

// GiB for models that need them, MiB or KiB for small ones.
inline int unit_shift(std::size_t largest, const char*& name) {
  if (largest >= std::size_t{1} << 30) return name = "GiB", 30;
  if (largest >= std::size_t{1} << 20) return name = "MiB", 20;
  return name = "KiB", 10;
}

// (plan - measured) / measured, in percent.
inline std::string error_percent(std::size_t planned, std::size_t measured) {
  if (measured == 0) return planned == 0 ? "0.0%" : "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.2f%%", 100.0 * (double(planned) - double(measured)) / double(measured));
  return buf;
}

inline void print_ledger(std::ostream& os, const std::string& title, const ledger_plan& p, const memory_ledger* m) {
  constexpr std::size_t w0 = 18, w = 14;
  const char* unit = "";
  const int shift = unit_shift(std::max(p.total_peak, m ? m->total_peak() : 0), unit);
  auto gib = [shift](std::size_t bytes) { return in_unit(bytes, shift); };
  os << cell(title + " " + unit, w0) << cell("plan peak", w) << cell("plan @peak", w);
  if (m) os << cell("run peak", w) << cell("run @peak", w);
  os << '\n';
  for (std::size_t i = 0; i < mem_category_count; ++i) {
    const auto c = static_cast<mem_category>(i);
    os << cell("  " + std::string(to_string(c)), w0) << cell(gib(p.peak[i]), w) << cell(gib(p.at_total_peak[i]), w);
    if (m) os << cell(gib(m->peak(c)), w) << cell(gib(m->at_total_peak(c)), w);
    os << '\n';
  }
  os << cell("  total", w0) << cell(gib(p.total_peak), w) << cell("", w);
  if (m) os << cell(gib(m->total_peak()), w) << "plan error " << error_percent(p.total_peak, m->total_peak());
  os << '\n';
  if (!p.peak_phase.empty()) os << "  plan peak at: " << p.peak_phase << '\n';
}

}  // namespace detail

// Device table, then the host table when the plan has offloaded state (or a host ledger is
// given). `measured_*` may be null: plan columns only.
inline void print_plan(std::ostream& os, const memory_plan& plan, const memory_ledger* measured_device = nullptr,
                       const memory_ledger* measured_host = nullptr, const memory_ledger* measured_nvme = nullptr) {
  detail::print_ledger(os, "device", plan.device, measured_device);
  if (const std::size_t extra = plan.overheads.total(plan.device.total_peak); extra > 0)
    os << "  + what the GPU holds beside the ledger (context, NCCL, pool, workspaces): "
       << format_bytes(double(extra)) << "; device total " << format_bytes(double(plan.device_total())) << '\n';
  if (plan.host.total_peak > 0 || measured_host)
    detail::print_ledger(os, plan.host_pinned ? "host (pinned)" : "host", plan.host, measured_host);
  if (plan.nvme.total_peak > 0 || measured_nvme) detail::print_ledger(os, "nvme", plan.nvme, measured_nvme);
  if (const tier_traffic& m = plan.moved; m.to_device + m.to_host + m.disk_read + m.disk_written > 0)
    os << "moved per rank per step: " << format_bytes(double(m.to_device)) << " to the device, "
       << format_bytes(double(m.to_host)) << " to the host, " << format_bytes(double(m.disk_read)) << " read from and "
       << format_bytes(double(m.disk_written)) << " written to disk\n";
  const step_traffic& t = plan.traffic;
  os << "sent per rank per step: " << format_bytes(double(t.shard_group)) << " in its shard group of "
     << plan.shard_group << " rank(s)";
  if (plan.shard_group != plan.world)
    os << ", " << format_bytes(double(t.across_groups)) << " across the " << plan.world / plan.shard_group
       << " replica groups";
  os << ", " << format_bytes(double(t.world)) << " in the ranks' checks over all " << plan.world << '\n';
}

}  // namespace zshard::plan

#pragma once
// Per-rank memory accounting (invariant I8). Every allocation the engine makes goes through a
// ledger under a category, so peak memory can be read per category and compared with the
// memory plan, and an optional hard budget turns an overshoot into an error that names the
// category, the request, the budget and the usage at that moment. A refused request leaves
// the ledger unchanged.
//
// One ledger per memory space per rank (e.g. a rank's device memory, a rank's host memory
// for offloaded state). A ledger is used from its rank's thread only and is not thread-safe.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "zshard/core/error.hpp"

namespace zshard {

enum class mem_category : std::uint8_t {
  sharded_params,   // this rank's slice of every parameter (working dtype) and replicated params
  gathered_params,  // full parameters gathered for a module in scope or prefetched
  grad_buckets,     // full gradients waiting for (or in) reduce-scatter
  grad_shards,      // this rank's fp32 gradient shards, accumulated over micro-batches
  optimizer_state,  // fp32 master parameters and AdamW moments
  activations,      // reported by the caller (the training stack owns activations)
  scratch,          // short-lived work space
};
inline constexpr std::size_t mem_category_count = 7;

constexpr std::string_view to_string(mem_category c) noexcept {
  switch (c) {
    case mem_category::sharded_params: return "sharded_params";
    case mem_category::gathered_params: return "gathered_params";
    case mem_category::grad_buckets: return "grad_buckets";
    case mem_category::grad_shards: return "grad_shards";
    case mem_category::optimizer_state: return "optimizer_state";
    case mem_category::activations: return "activations";
    case mem_category::scratch: return "scratch";
  }
  return "?";
}

// Formats a byte count for humans: "1.50 GiB".
inline std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(u == 0 ? 0 : 2);
  os << bytes << ' ' << units[u];
  return os.str();
}

// Told of every change of a ledger, right after it (an opt-in trace: trace/rank_trace.hpp).
// Called on the thread that charged or released; must not throw.
class memory_ledger;
class ledger_observer {
 public:
  virtual void on_ledger_change(const memory_ledger& ledger) noexcept = 0;

 protected:
  ~ledger_observer() = default;
};

class memory_ledger {
 public:
  explicit memory_ledger(std::string name = "memory", std::optional<std::size_t> budget_bytes = std::nullopt)
      : name_(std::move(name)), budget_(budget_bytes) {}

  // Accounts `bytes` more in category `c`; throws error_kind::budget and changes nothing when
  // the total would exceed the budget.
  // (Every gather, release and gradient passes here: the checks are inline, their messages
  // out of line.)
  void charge(mem_category c, std::size_t bytes) {
    std::size_t new_total;
    if (__builtin_add_overflow(total_, bytes, &new_total)) [[unlikely]]
      throw_overflow(c, bytes);
    if (budget_ && new_total > *budget_) [[unlikely]]
      throw_over_budget(c, bytes);
    std::size_t& cur = current_[index(c)];
    cur += bytes;
    if (cur > peak_[index(c)]) peak_[index(c)] = cur;
    total_ = new_total;
    if (total_ > total_peak_) {
      total_peak_ = total_;
      at_total_peak_ = current_;
    }
    if (observer_.p) [[unlikely]] observer_.p->on_ledger_change(*this);
  }

  // Returns `bytes` in category `c`. Returning more than is accounted is a bookkeeping bug.
  void release(mem_category c, std::size_t bytes) {
    std::size_t& cur = current_[index(c)];
    if (bytes > cur) [[unlikely]]
      throw_over_release(c, bytes);
    cur -= bytes;
    total_ -= bytes;
    if (observer_.p) [[unlikely]] observer_.p->on_ledger_change(*this);
  }

  std::size_t current(mem_category c) const noexcept { return current_[index(c)]; }
  std::size_t peak(mem_category c) const noexcept { return peak_[index(c)]; }
  std::size_t total_current() const noexcept { return total_; }
  std::size_t total_peak() const noexcept { return total_peak_; }
  // Per-category usage at the moment the total peaked (peaks per category may be at other times).
  std::size_t at_total_peak(mem_category c) const noexcept { return at_total_peak_[index(c)]; }
  std::optional<std::size_t> budget() const noexcept { return budget_; }
  const std::string& name() const noexcept { return name_; }

  void set_budget(std::optional<std::size_t> budget_bytes) { budget_ = budget_bytes; }

  // At most one observer; nullptr detaches. The observer must outlive its attachment.
  // A copy of a ledger starts unobserved.
  void set_observer(ledger_observer* o) noexcept { observer_.p = o; }
  ledger_observer* observer() const noexcept { return observer_.p; }

  // Starts a new peak window (e.g. per step) from the current usage.
  void reset_peaks() noexcept {
    peak_ = current_;
    total_peak_ = total_;
    at_total_peak_ = current_;
  }

  // A table of current and peak bytes by category.
  std::string report() const {
    std::ostringstream os;
    os << name_ << (budget_ ? " (budget " + format_bytes(double(*budget_)) + ")" : std::string()) << "\n";
    for (std::size_t i = 0; i < mem_category_count; ++i) {
      const auto c = static_cast<mem_category>(i);
      os << "  " << to_string(c) << ": current " << format_bytes(double(current_[i])) << ", peak "
         << format_bytes(double(peak_[i])) << "\n";
    }
    os << "  total: current " << format_bytes(double(total_)) << ", peak " << format_bytes(double(total_peak_)) << "\n";
    return os.str();
  }

 private:
  static constexpr std::size_t index(mem_category c) noexcept { return static_cast<std::size_t>(c); }

  [[noreturn, gnu::cold, gnu::noinline]] void throw_overflow(mem_category c, std::size_t bytes) const {
    throw error(error_kind::budget,
                name_ + ": request of " + std::to_string(bytes) + " bytes for " + std::string(to_string(c)) +
                    " overflows the byte count (in use " + std::to_string(total_) + ")",
                "a size computation upstream is wrong: no allocation is this large");
  }
  [[noreturn, gnu::cold, gnu::noinline]] void throw_over_budget(mem_category c, std::size_t bytes) const {
    std::ostringstream os;
    os << name_ << ": request of " << bytes << " bytes (" << format_bytes(double(bytes)) << ") for " << to_string(c)
       << " exceeds the budget of " << *budget_ << " bytes (" << format_bytes(double(*budget_)) << "); in use "
       << total_ << " bytes (" << format_bytes(double(total_)) << "), of which " << to_string(c) << " "
       << current_[index(c)] << " bytes";
    throw error(error_kind::budget, os.str(),
                "raise the memory budget, or lower max_live_numel / reduce_bucket_numel / micro-batch size");
  }
  [[noreturn, gnu::cold, gnu::noinline]] void throw_over_release(mem_category c, std::size_t bytes) const {
    throw error(error_kind::invariant, name_ + ": release of " + std::to_string(bytes) + " bytes from " +
                                           std::string(to_string(c)) + " which holds only " +
                                           std::to_string(current_[index(c)]));
  }

  std::string name_;
  std::optional<std::size_t> budget_;
  std::array<std::size_t, mem_category_count> current_{};
  std::array<std::size_t, mem_category_count> peak_{};
  std::array<std::size_t, mem_category_count> at_total_peak_{};
  std::size_t total_ = 0;
  std::size_t total_peak_ = 0;
  struct observer_slot {  // not copied: the observer watches one ledger
    ledger_observer* p = nullptr;
    observer_slot() = default;
    observer_slot(const observer_slot&) noexcept {}
    observer_slot& operator=(const observer_slot&) noexcept { return *this; }
  } observer_;
};

}  // namespace zshard

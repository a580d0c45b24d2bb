#pragma once
// One rank's share of an opt-in trace (trace/trace_sink.hpp): the engine's events on that rank
// (spans with a start and a duration, instants) and its memory ledger as a counter, sampled at
// every charge and release, so the counter's peak is the ledger's peak.
//
// A rank_trace is written by its rank's thread only (as the ledger and the engine are); the
// sink reads it once every rank is done. Recording can be paused (trace_sink::set_recording):
// events are then dropped, and the first event after a resume re-samples the ledger.
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/core/memory_ledger.hpp"

namespace zshard {

struct trace_event {
  char phase = 'X';           // 'X' a span (ts, dur), 'i' an instant, 'C' a ledger counter sample
  std::string_view category;  // static strings only: "scope", "gather", "reduce", ...
  std::string name;
  std::string detail;  // the module, or empty
  double ts_us = 0;    // since the sink's creation
  double dur_us = 0;
  std::array<std::size_t, mem_category_count> bytes{};  // 'C' only: each category's bytes
};

class rank_trace final : public ledger_observer {
 public:
  using clock = std::chrono::steady_clock;

  rank_trace(int rank, clock::time_point origin, const std::atomic<bool>& recording)
      : rank_(rank), origin_(origin), recording_(recording) {}

  int rank() const noexcept { return rank_; }
  const std::vector<trace_event>& events() const noexcept { return events_; }

  // Watches `l` (the rank's device ledger): a counter sample now and at every change.
  void watch(memory_ledger& l) {
    ledger_ = &l;
    l.set_observer(this);
    sample(l);
  }
  void unwatch() noexcept {
    if (ledger_ && ledger_->observer() == this) ledger_->set_observer(nullptr);
    ledger_ = nullptr;
  }

  clock::time_point now() const noexcept { return clock::now(); }

  void span(std::string_view category, std::string name, std::string_view detail, clock::time_point begin,
            clock::time_point end) {
    if (!live()) return;
    trace_event e;
    e.category = category;
    e.name = std::move(name);
    e.detail = detail;
    e.ts_us = us(begin);
    e.dur_us = std::chrono::duration<double, std::micro>(end - begin).count();
    events_.push_back(std::move(e));
  }

  void instant(std::string_view category, std::string name, std::string_view detail = {}) {
    if (!live()) return;
    trace_event e;
    e.phase = 'i';
    e.category = category;
    e.name = std::move(name);
    e.detail = detail;
    e.ts_us = us(clock::now());
    events_.push_back(std::move(e));
  }

  // A module scope's user work (forward, backward, recompute, no_grad) as one span, from the
  // scope's opening to its closing; scopes may nest.
  void scope_open(std::size_t module, std::string_view kind) { open_scopes_.push_back({module, kind, now()}); }
  void scope_close(std::size_t module, bool backward, std::string_view module_name) {
    for (std::size_t i = open_scopes_.size(); i-- > 0;) {
      const open_scope o = open_scopes_[i];
      if (o.module != module || (o.kind == "backward") != backward) continue;
      open_scopes_.erase(open_scopes_.begin() + std::ptrdiff_t(i));
      span("scope", std::string(o.kind), module_name, o.begin, now());
      return;
    }
  }

  void on_ledger_change(const memory_ledger& l) noexcept override {
    try {
      if (live()) sample(l);
    } catch (...) {
      // out of memory while tracing: the trace loses a sample, the run goes on
    }
  }

 private:
  // Recording now? After a pause, re-samples the ledger first so the counter is right.
  bool live() {
    const bool on = recording_.load(std::memory_order_relaxed);
    if (on && !was_on_ && ledger_) {
      was_on_ = true;
      sample(*ledger_);
    }
    was_on_ = on;
    return on;
  }
  void sample(const memory_ledger& l) {
    if (!recording_.load(std::memory_order_relaxed)) return;
    trace_event e;
    e.phase = 'C';
    e.category = "memory";
    e.name = l.name();
    e.ts_us = us(clock::now());
    for (std::size_t c = 0; c < mem_category_count; ++c) e.bytes[c] = l.current(mem_category(c));
    events_.push_back(std::move(e));
  }
  double us(clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }

  struct open_scope {
    std::size_t module;
    std::string_view kind;  // a static string
    clock::time_point begin;
  };

  int rank_;
  clock::time_point origin_;
  const std::atomic<bool>& recording_;
  bool was_on_ = true;
  memory_ledger* ledger_ = nullptr;
  std::vector<trace_event> events_;
  std::vector<open_scope> open_scopes_;
};

// Times a span of engine work on one rank; does nothing at all when the trace is off (null).
class trace_span {
 public:
  trace_span(rank_trace* t, std::string_view category, std::string_view name, std::string_view detail = {}) : t_(t) {
    if (t_) [[unlikely]] {
      category_ = category;
      name_ = name;
      detail_ = detail;
      begin_ = t_->now();
    }
  }
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;
  ~trace_span() {
    if (t_) [[unlikely]]
      emit();  // out of line: an untraced scope pays one test per span
  }

 private:
  [[gnu::cold, gnu::noinline]] void emit() noexcept {
    try {
      t_->span(category_, std::string(name_), detail_, begin_, t_->now());
    } catch (...) {
      // a trace that cannot grow loses the event, never the run
    }
  }

  rank_trace* t_;
  std::string_view category_, name_, detail_;
  rank_trace::clock::time_point begin_{};
};

}  // namespace zshard

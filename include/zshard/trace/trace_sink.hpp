#pragma once
// An opt-in trace of engine events on every rank, written as Chrome trace JSON, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one process per rank, its engine events on one
// track (scopes, gathers, releases, reduce-scatters, the optimizer, waits) and its memory ledger
// as a counter by category, so a step's memory timeline can be read next to what caused it.
//
//   zshard::trace_sink trace;                     // outlives the engines
//   cfg.trace = &trace;                           // engine_config: every rank records
//   ... train ...
//   trace.write_file("trace.json");               // after the ranks are done
//
// Off (cfg.trace == nullptr, the default) it costs a null check per engine event. Each rank
// records into its own buffer; write() must not run while ranks still record.
#include <atomic>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <ostream>
#include <string>

#include "zshard/core/error.hpp"
#include "zshard/trace/rank_trace.hpp"

namespace zshard {

class trace_sink {
 public:
  trace_sink() = default;
  trace_sink(const trace_sink&) = delete;
  trace_sink& operator=(const trace_sink&) = delete;

  // The buffer of rank r, created on first use (thread-safe; the reference stays valid).
  rank_trace& rank(int r) {
    std::lock_guard lock(mu_);
    auto it = by_rank_.find(r);
    if (it != by_rank_.end()) return *it->second;
    rank_trace& t = ranks_.emplace_back(r, origin_, recording_);
    by_rank_.emplace(r, &t);
    return t;
  }

  // Pauses or resumes recording on every rank (e.g. to trace only some steps).
  void set_recording(bool on) noexcept { recording_.store(on, std::memory_order_relaxed); }
  bool recording() const noexcept { return recording_.load(std::memory_order_relaxed); }

  // A value the trace carries for tools (e.g. "plan_peak_bytes" for tools/plot_memory.py).
  void set_metadata(const std::string& key, double value) {
    std::lock_guard lock(mu_);
    metadata_[key] = value;
  }

  void write(std::ostream& os) const {
    std::lock_guard lock(mu_);
    os << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"zshard\"";
    for (const auto& [k, v] : metadata_) os << ",\"" << escaped(k) << "\":" << number(v);
    os << "},\n\"traceEvents\":[\n";
    bool first = true;
    auto sep = [&] {
      if (!first) os << ",\n";
      first = false;
    };
    for (const auto& [r, t] : by_rank_) {
      sep();
      os << R"({"ph":"M","name":"process_name","pid":)" << r << R"(,"args":{"name":"rank )" << r << "\"}}";
      sep();
      os << R"({"ph":"M","name":"process_sort_index","pid":)" << r << R"(,"args":{"sort_index":)" << r << "}}";
      for (const auto& e : t->events()) {
        sep();
        os << "{\"ph\":\"" << e.phase << "\",\"cat\":\"" << e.category << "\",\"name\":\"" << escaped(e.name)
           << "\",\"pid\":" << r << ",\"tid\":0,\"ts\":" << number(e.ts_us);
        if (e.phase == 'X') os << ",\"dur\":" << number(e.dur_us);
        if (e.phase == 'i') os << ",\"s\":\"t\"";
        if (e.phase == 'C') {
          os << ",\"args\":{";
          for (std::size_t c = 0; c < mem_category_count; ++c)
            os << (c ? "," : "") << '"' << to_string(mem_category(c)) << "\":" << e.bytes[c];
          os << '}';
        } else if (!e.detail.empty()) {
          os << ",\"args\":{\"module\":\"" << escaped(e.detail) << "\"}";
        }
        os << '}';
      }
    }
    os << "\n]}\n";
  }

  void write_file(const std::string& path) const {
    std::ofstream f(path, std::ios::binary);
    ZSHARD_REQUIRE(f.good(), error_kind::io, "cannot write the trace to '" + path + "'",
                   "check the path and permissions");
    write(f);
    f.close();
    ZSHARD_REQUIRE(f.good(), error_kind::io, "writing the trace to '" + path + "' failed", "check free disk space");
  }

 private:
  static std::string number(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", x);
    return buf;
  }
  static std::string escaped(const std::string& s) {
    std::string out;
    for (char ch : s) {
      if (ch == '"' || ch == '\\') {
        out += '\\';
        out += ch;
      } else if (static_cast<unsigned char>(ch) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", ch);
        out += buf;
      } else {
        out += ch;
      }
    }
    return out;
  }

  mutable std::mutex mu_;
  rank_trace::clock::time_point origin_ = rank_trace::clock::now();
  std::atomic<bool> recording_{true};
  std::deque<rank_trace> ranks_;
  std::map<int, rank_trace*> by_rank_;
  std::map<std::string, double> metadata_;
};

}  // namespace zshard

#pragma once
// A running hash of the schedule a rank runs: every scope (module, use, forward or backward)
// and every boundary (begin/end of backward, step, discard), in order. Ranks that ran the same
// schedule hold the same value; it is compared across ranks at every step() before the
// optimizer applies anything (and at every scope in checked mode), and it travels in each
// collective's tag where the communicator takes tags (comm/communicator.hpp), so two ranks
// that diverged are caught at their next collective or, at the latest, before the update.
//
// The scopes of the current step (or forward-only pass: end_pass() is its boundary) are kept
// (module and use, 4 bytes each) so that, when the values differ, the ranks can find the first
// scope where they diverged and name it.
#include <cstdint>
#include <vector>

#include "zshard/comm/communicator.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/model/use_kind.hpp"

namespace zshard {

enum class schedule_event : std::uint8_t { begin_backward = 1, end_backward, step, discard, end_pass };

class schedule_fingerprint {
 public:
  // A scope, packed: module << 3 | backward << 2 | use_kind.
  using entry = std::uint32_t;
  struct saved {
    std::uint64_t hash, scopes;
    std::size_t history;
  };

  // Per scope: a multiply, an xor and an append (the cost bench/seed_70b's scope_overhead_ns
  // bounds).
  void on_scope(module_id m, use_kind kind, bool backward) {
    const entry e = (m << 3) | (backward ? 4u : 0u) | static_cast<std::uint32_t>(kind);
    mix(e);
    ++scopes_;
    history_.push_back(e);
  }
  void on_event(schedule_event e) noexcept { mix(0xfffffff0u | static_cast<std::uint32_t>(e)); }

  // Undoes the scopes recorded since save() (a scope whose open failed).
  saved save() const noexcept { return {hash_, scopes_, history_.size()}; }
  void restore(const saved& s) noexcept {
    hash_ = s.hash;
    scopes_ = s.scopes;
    history_.resize(s.history);
  }
  // Every rank adopts the same state (after a discard, whatever each had run).
  void adopt(std::uint64_t hash, std::uint64_t scopes) noexcept {
    hash_ = hash;
    scopes_ = scopes;
    start_step();
  }
  void start_step() noexcept {
    history_.clear();
    first_scope_ = scopes_ + 1;
  }

  std::uint64_t value() const noexcept { return hash_; }
  std::uint64_t scopes() const noexcept { return scopes_; }  // scopes opened since construction
  std::uint64_t first_scope_of_step() const noexcept { return first_scope_; }
  const std::vector<entry>& history() const noexcept { return history_; }  // this step's scopes

  collective_tag tag(collective_use use, module_id m = collective_tag::none,
                     param_id p = collective_tag::none) const noexcept {
    return {use, m, p, scopes_, hash_};
  }

  // tag(use, m) written field by field into `out`: the engine's per-scope tag, which the scope's
  // gathers copy a little later. (Built whole and assigned, it goes through a temporary read
  // back at once by a 32-byte load that no store forwards to: a stall per scope.)
  void write_tag(collective_tag& out, collective_use use, module_id m) const noexcept {
    out.use = use;
    out.module = m;
    out.param = collective_tag::none;
    out.scope = scopes_;
    out.hash = hash_;
  }

  static module_id module(entry e) noexcept { return e >> 3; }
  static bool backward(entry e) noexcept { return (e & 4u) != 0; }
  static use_kind kind(entry e) noexcept { return static_cast<use_kind>(e & 3u); }

 private:
  // Order-sensitive: each value is folded in with a multiply by an odd constant (FNV-1a on
  // words); ranks compare values for equality only, so this needs no stronger mixing.
  void mix(std::uint32_t v) noexcept { hash_ = (hash_ ^ v) * 0x100000001b3ull; }

  // hash_ and scopes_ apart: tag() reads both right after on_scope() wrote them, and adjacent
  // they are read as one 16-byte load that no store forwards to (a stall per scope).
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
  std::uint64_t first_scope_ = 1;
  std::uint64_t scopes_ = 0;
  std::vector<entry> history_;
};

}  // namespace zshard

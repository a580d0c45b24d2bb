#pragma once
// Ranks agree or fail (I9): the engine's exchanges that check every rank runs the same model,
// the same schedule-shaping settings and the same schedule, and the step's gradient statistics.
// Each is one all_gather of a few 64-bit words (as f32 pairs: an all_gather copies, so the bits
// arrive intact on every communicator, NCCL included), and every rank reads every rank's words,
// so every rank reaches the same verdict and throws the same error.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zshard/backend/backend.hpp"
#include "zshard/comm/communicator.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/format.hpp"
#include "zshard/engine/schedule_fingerprint.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/optim/param_groups.hpp"
#include "zshard/state/stream_roles.hpp"

namespace zshard {

// How a setting's 64-bit word reads in a message: as the value it was made from.
enum class setting_kind : std::uint8_t {
  count,  // an integer (sizes, counts)
  real,   // a double's bits
  flag,   // 0 or 1
  type,   // a dtype
  hash,   // a fingerprint of many values (the model, the layouts, the parameter groups)
};

struct setting_value {
  std::string name;
  std::uint64_t value;
  setting_kind kind = setting_kind::count;
};

inline std::string describe_setting(setting_kind k, std::uint64_t v) {
  switch (k) {
    case setting_kind::real:
      return format_number(std::bit_cast<double>(v));
    case setting_kind::flag:
      return v == 0 ? "false" : v == 1 ? "true" : std::to_string(v);
    case setting_kind::type:
      return v <= std::uint64_t(dtype::f16) ? std::string(to_string(static_cast<dtype>(v))) : std::to_string(v);
    case setting_kind::hash:
      return "hash " + format_hex(v);
    case setting_kind::count:
      break;
  }
  return std::to_string(v);
}

// A rank's part of the step's gradient norm (engine/grad_norm.hpp): for norm type 2 the sum of
// squares, for 1 the sum of |g|, for inf the largest |g|, over the gradient shards it owns (a
// replicated parameter on rank 0 only); and whether it saw an Inf/NaN element.
struct local_grad_norm {
  double part = 0;
  bool nonfinite = false;
  double norm_type = 2.0;
};

// What same_arguments carries for a failure one rank sees: code 0 is none; the meaning of the
// code and of its two detail words (an element index, a value's bits) is the caller's.
struct argument_problem {
  std::uint64_t code = 0, detail = 0, value = 0;
};

// The words same_arguments exchanges for a call of `arguments` arguments: those and the three of
// an argument_problem. What the planner charges for a control call's check.
constexpr std::size_t argument_check_words(std::size_t arguments) { return arguments + 3; }

struct global_grad_stats {
  double norm = 0;        // of type norm_type, over every rank's parts combined in double in rank order
  bool overflow = false;  // an Inf/NaN gradient element on some rank
};

// Scratch an exchange of `words` 64-bit words holds at once (its send and receive buffers), and
// the words the step's exchange carries: what the planner charges for them.
constexpr std::size_t exchange_scratch_bytes(std::size_t words, int world) {
  return 8 * words * (1 + static_cast<std::size_t>(world));
}
// fingerprint, scope count, norm part, overflow, the learning rates' hash
inline constexpr std::size_t step_exchange_words = 5;

// The exchange under rank_agreement, for callers without an engine's streams (the hybrid
// layout is checked before its groups exist: engine/hybrid_groups.hpp).
template <class Backend, class Comm>
std::vector<std::uint64_t> exchange_words(Backend& backend, Comm& comm, typename Backend::stream& stream,
                                          comm_stream on, const std::vector<std::uint64_t>& mine,
                                          const collective_tag& tag) {
  const std::size_t n = mine.size(), world = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> all(n * world);
  buffer<Backend> send(backend, dtype::f32, 2 * n, mem_category::scratch, stream);
  buffer<Backend> recv(backend, dtype::f32, 2 * n * world, mem_category::scratch, stream);
  if constexpr (Backend::holds_storage) backend.copy(send.data(), mine.data(), n * 8, stream);
  tagged::all_gather(comm, send.data(), recv.data(), 2 * n, dtype::f32, on, tag);
  if constexpr (Backend::holds_storage) {
    backend.copy(all.data(), recv.data(), all.size() * 8, stream);
    backend.synchronize(stream);
  } else {
    for (std::size_t r = 0; r < world; ++r) std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(r * n));
  }
  return all;
}

// Every rank built the same model with the same schedule-shaping settings, or every rank throws
// naming the first that differs.
template <class Backend, class Comm>
void check_settings_on(Backend& backend, Comm& comm, typename Backend::stream& stream, comm_stream on,
                       const std::vector<setting_value>& settings) {
  std::vector<std::uint64_t> mine;
  for (const auto& s : settings) mine.push_back(s.value);
  const auto all = exchange_words(backend, comm, stream, on, mine, {collective_use::setup});
  const std::size_t n = mine.size();
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t r = 1; r < std::size_t(comm.size()); ++r)
      ZSHARD_REQUIRE(all[r * n + i] == all[i], error_kind::config,
                     "ranks disagree on " + settings[i].name + ": rank 0 has " +
                         describe_setting(settings[i].kind, all[i]) + ", rank " + std::to_string(r) + " has " +
                         describe_setting(settings[i].kind, all[r * n + i]),
                     "build the same model_spec and engine_config on every rank (every setting that shapes the "
                     "schedule of collectives must agree)");
}

template <class Backend, class Comm>
class rank_agreement {
 public:
  rank_agreement(Backend& backend, Comm& comm, stream_roles<Backend>& streams, const model_spec& spec)
      : backend_(backend), comm_(comm), streams_(streams), spec_(spec) {}

  // Every rank's `mine` (same length on every rank): rank r's words at [r * n, (r + 1) * n).
  // Without storage (phantom) the collective is still issued, for its accounting, and every
  // rank is taken to hold this rank's words.
  std::vector<std::uint64_t> exchange(const std::vector<std::uint64_t>& mine, const collective_tag& tag) {
    // In the compute stream's order (the training stack's stream when it brought one).
    return exchange_words(backend_, comm_, streams_.on(stream_role::compute), streams_.collective_on(stream_role::compute),
                          mine, tag);
  }

  // Construction: every rank built the same model with the same schedule-shaping settings.
  void check_settings(const std::vector<setting_value>& settings) {
    check_settings_on(backend_, comm_, streams_.on(stream_role::compute), streams_.collective_on(stream_role::compute),
                      settings);
  }

  // step(): the schedule fingerprints agree (else throws, naming the first scope where the
  // ranks diverged), so do the learning rates the step is about to apply (set_lr on some ranks
  // only would train one parameter's shards at two rates: else throws, naming each group that
  // differs and every rank's rate), and the gradient norm, every rank's part combined in double
  // in rank order (sum for types 2 and 1, then the square root for 2; max for inf), so the result
  // does not depend on the world size or on timing. One exchange, whatever the norm type; the
  // failures cost more exchanges, which every rank makes (every rank saw the same mismatch).
  // `step`: the 1-based number of the step being checked.
  global_grad_stats at_step(const local_grad_norm& local, const schedule_fingerprint& fp,
                            const optim::param_groups& groups, std::int64_t step) {
    constexpr std::size_t n = step_exchange_words;
    const std::vector<std::uint64_t> mine = {fp.value(), fp.scopes(), std::bit_cast<std::uint64_t>(local.part),
                                             local.nonfinite ? 1u : 0u, groups.lr_hash()};
    static_assert(n == 5);
    // Tagged without the hash: ranks whose schedules differ still meet here, and find where.
    const auto all = exchange(mine, {collective_use::step_check});
    const std::size_t world = static_cast<std::size_t>(comm_.size());
    for (std::size_t r = 0; r < world; ++r)
      if (all[r * n] != all[0] || all[r * n + 1] != all[1]) report_divergence(fp, "step()");
    for (std::size_t r = 0; r < world; ++r)
      if (all[r * n + 4] != all[4]) report_learning_rates(groups, step);
    const bool max_norm = std::isinf(local.norm_type);
    global_grad_stats g;
    double combined = 0;
    for (std::size_t r = 0; r < world; ++r) {
      const double part = std::bit_cast<double>(all[r * n + 2]);
      combined = max_norm ? (std::isnan(part) || part > combined ? part : combined) : combined + part;
      g.overflow = g.overflow || all[r * n + 3] != 0;
    }
    g.overflow = g.overflow || !std::isfinite(combined);
    g.norm = local.norm_type == 2.0 ? std::sqrt(combined) : combined;
    return g;
  }

  // A call whose collectives depend on its arguments (set_trainable, set_gradient_sync, a state
  // write's writer rank, ...): every rank passed the same `values`, else every rank throws the
  // same usage error naming `what` and each differing argument as every rank passed it.
  // `problem`: a failure only this rank can see (a bad value on the writer rank), as a code (0:
  // none) and two words of detail; any rank's becomes every rank's error, worded by `describe`
  // from those words alone, so that every rank throws the same text. One exchange.
  void same_arguments(const std::string& what, const std::vector<std::uint64_t>& values,
                      const argument_problem& problem = {},
                      const std::function<std::string(const argument_problem&)>& describe = {}) {
    std::vector<std::uint64_t> mine = values;
    mine.insert(mine.end(), {problem.code, problem.detail, problem.value});
    static_assert(argument_check_words(0) == 3);
    const std::size_t n = mine.size(), k = values.size(), world = static_cast<std::size_t>(comm_.size());
    const auto all = exchange(mine, {collective_use::arguments});
    if constexpr (!Backend::holds_storage) return;  // no peers' words (phantom): nothing to compare
    for (std::size_t i = 0; i < k; ++i) {
      bool same = true;
      for (std::size_t r = 1; r < world; ++r) same = same && all[r * n + i] == all[i];
      if (same) continue;
      std::string each;
      for (std::size_t r = 0; r < world; ++r)
        each += (r ? ", rank " : "rank ") + std::to_string(r) + " passed " + std::to_string(all[r * n + i]);
      throw error(
          error_kind::usage,
          "ranks called " + what + " with different arguments: argument #" + std::to_string(i + 1) + ": " + each,
          "call it on every rank with the same arguments, at the same point of the training loop");
    }
    for (std::size_t r = 0; r < world; ++r) {
      const argument_problem p{all[r * n + k], all[r * n + k + 1], all[r * n + k + 2]};
      if (p.code != 0)
        throw error(error_kind::usage, what + ": rank " + std::to_string(r) + " " + (describe ? describe(p) : "failed"),
                    "every rank took part and none changed anything; fix the call on that rank");
    }
  }

  // check_every_scope: the fingerprints agree now, before the scope's gathers.
  void at_scope(const schedule_fingerprint& fp) {
    const auto all = exchange({fp.value(), fp.scopes()}, {collective_use::scope_check});
    for (std::size_t r = 0; r < std::size_t(comm_.size()); ++r)
      if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) report_divergence(fp, "the scope check");
  }

  // Every rank takes rank 0's schedule position (after discard_gradients, where ranks may have
  // stopped at different points).
  void resynchronize(schedule_fingerprint& fp) {
    const auto all = exchange({fp.value(), fp.scopes()}, {collective_use::discard});
    fp.adopt(all[0], all[1]);
  }

 private:
  static constexpr std::uint64_t no_scope = ~std::uint64_t{0};

  std::string describe_scope(std::uint64_t e) const {
    if (e == no_scope) return "no scope (its step ended earlier)";
    const auto en = static_cast<schedule_fingerprint::entry>(e);
    std::string d = schedule_fingerprint::backward(en)
                        ? std::string("backward")
                        : "forward (" + std::string(to_string(schedule_fingerprint::kind(en))) + ")";
    return d + " of module '" + spec_.module(schedule_fingerprint::module(en)).name + "'";
  }

  // One more exchange (every rank makes it: every rank saw the same hash differ) brings every
  // rank's learning rate of every group (the groups agree: checked at construction).
  [[noreturn]] void report_learning_rates(const optim::param_groups& groups, std::int64_t step) {
    const std::size_t k = groups.size(), world = static_cast<std::size_t>(comm_.size());
    std::vector<std::uint64_t> mine;
    for (std::size_t g = 0; g < k; ++g) mine.push_back(std::bit_cast<std::uint32_t>(groups.lr(g)));
    const auto all = exchange(mine, {collective_use::step_check});
    auto lr = [&](std::size_t r, std::size_t g) {
      return std::bit_cast<float>(static_cast<std::uint32_t>(all[r * k + g]));
    };
    std::string msg = "ranks disagree on the learning rates at step " + std::to_string(step) + ":";
    for (std::size_t g = 0; g < k; ++g) {
      bool same = true;
      for (std::size_t r = 1; r < world; ++r) same = same && all[r * k + g] == all[g];
      if (same) continue;
      msg += " group '" + groups.name(g) + "':";
      for (std::size_t r = 0; r < world; ++r)
        msg += (r ? ", rank " : " rank ") + std::to_string(r) + " has " + format_number(lr(r, g));
      msg += ";";
    }
    msg.pop_back();
    throw error(error_kind::usage, msg + " (the step was not applied)",
                "call set_lr (and restore_run_counters) on every rank with the same values, as a schedule that "
                "computes the rate from the step does; a rate set on one rank only would train the shards of one "
                "parameter at two rates");
  }

  // Two more exchanges (every rank makes them: every rank saw the same mismatch) find the first
  // scope of this step where the ranks' histories differ.
  [[noreturn]] void report_divergence(const schedule_fingerprint& fp, const char* where) {
    const std::size_t world = static_cast<std::size_t>(comm_.size());
    const auto lengths = exchange({fp.history().size()}, {collective_use::step_check});
    std::size_t longest = 0;
    for (auto l : lengths) longest = std::max<std::size_t>(longest, l);
    std::vector<std::uint64_t> mine(longest, no_scope);
    std::copy(fp.history().begin(), fp.history().end(), mine.begin());
    const auto all = longest ? exchange(mine, {collective_use::step_check}) : std::vector<std::uint64_t>{};
    auto at = [&](std::size_t r, std::size_t i) { return all[r * longest + i]; };
    std::string msg = std::string("ranks ran different schedules (found at ") + where + " on rank " +
                      std::to_string(comm_.rank()) + ")";
    std::size_t i = 0;
    for (; i < longest; ++i) {
      bool same = true;
      for (std::size_t r = 1; r < world; ++r) same = same && at(r, i) == at(0, i);
      if (!same) break;
    }
    if (i < longest) {
      msg += ": they diverged at scope #" + std::to_string(fp.first_scope_of_step() + i) + " (scope " +
             std::to_string(i + 1) + " of this step):";
      for (std::size_t r = 0; r < world; ++r) msg += (r ? "; rank " : " rank ") + std::to_string(r) + " ran " + describe_scope(at(r, i));
    } else {
      msg += ": their scopes of this step agree, but a begin_backward(), end_backward() or step() differs, or they "
             "diverged in an earlier step";
    }
    throw error(error_kind::comm, msg,
                "every rank must open the same scopes in the same order (same modules, same uses): data-dependent "
                "routing, skipped modules and per-rank settings must agree across ranks; the step was not applied");
  }

  Backend& backend_;
  Comm& comm_;
  stream_roles<Backend>& streams_;
  const model_spec& spec_;
};

}  // namespace zshard

#pragma once
// Before a save writes anything, the ranks agree on every setting a checkpoint records: the step,
// the loss scaler's state, each parameter group's learning rate, and each parameter's trainable
// flag and whether it has optimizer state. Each rank holds its own copy of these, and a save
// records one rank's (rank 0's run counters): were a rate set on one rank only (set_lr between a
// step and the save), the checkpoint would silently record rank 0's, and a resumed run would
// train at a rate the run never had on the other ranks. A disagreement is an error on every rank,
// naming each setting and every rank whose value differs from rank 0's; nothing is written.
// One small collective (agreement.hpp: each rank's settings as one message).
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/core/format.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard::checkpoint {

namespace detail {
// One recorded setting as a 64-bit word, and how it reads in a message.
struct recorded_setting {
  std::string name;
  std::uint64_t word;
  enum kind_t : std::uint8_t { count, rate, flag } kind;
  std::string show(std::uint64_t w) const {
    if (kind == rate) return format_number(std::bit_cast<float>(static_cast<std::uint32_t>(w)));
    if (kind == flag) return w ? "true" : "false";
    return std::to_string(static_cast<std::int64_t>(w));
  }
};

// The run's settings (a few words, exchanged whole) ...
template <class Engine>
std::vector<recorded_setting> run_settings(Engine& eng) {
  using k = recorded_setting;
  const run_state r = eng.run_counters();
  auto count = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  auto rate = [](float v) { return std::uint64_t{std::bit_cast<std::uint32_t>(v)}; };
  std::vector<recorded_setting> out = {
      {"the step", count(r.step), k::count},
      {"the loss scale", rate(r.scaler.scale), k::rate},
      {"the loss scaler's skipped steps", count(r.scaler.skipped_steps), k::count},
      {"the loss scaler's overflows at the minimum scale", count(r.scaler.overflows_at_min_scale), k::count},
      {"the loss scaler's good steps in a row", count(r.scaler.good_steps_in_row), k::count},
  };
  const auto& groups = eng.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g)
    out.push_back({"the learning rate of parameter group '" + groups.name(g) + "'", rate(groups.lr(g)), k::rate});
  return out;
}
// ... and each parameter's flags (two per parameter: exchanged as a hash first, whole only when
// the hashes differ, so that a large model costs one word).
template <class Engine>
std::vector<recorded_setting> parameter_settings(Engine& eng) {
  std::vector<recorded_setting> out;
  for (param_id p = 0; p < eng.spec().params().size(); ++p) {
    const std::string& name = eng.spec().params()[p].name;
    out.push_back(
        {"whether '" + name + "' is trainable", eng.spec().params()[p].trainable ? 1u : 0u, recorded_setting::flag});
    out.push_back(
        {"whether '" + name + "' has optimizer state", eng.has_optimizer_state(p) ? 1u : 0u, recorded_setting::flag});
  }
  return out;
}
inline std::uint64_t hash_of(const std::vector<recorded_setting>& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& x : s) h = (h ^ x.word) * 0x100000001b3ull;
  return h;
}

// Every rank's words for `settings` (plus `extra` words after them), exchanged; each setting
// whose value differs from rank 0's on some rank, one line each, naming those ranks.
template <class Engine>
std::vector<std::string> exchange_settings(Engine& eng, const std::vector<recorded_setting>& settings,
                                           std::vector<std::uint64_t> extra, std::string& differences,
                                           const std::string& what) {
  std::vector<std::uint64_t> mine;
  for (const auto& x : settings) mine.push_back(x.word);
  mine.insert(mine.end(), extra.begin(), extra.end());
  std::string bytes(mine.size() * 8, '\0');
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::vector<std::string> all = exchange_messages(eng, bytes);
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r].size() != bytes.size())  // the groups and the model were checked at construction
      throw error(error_kind::usage, what + ": rank " + std::to_string(r) + " records " +
                                         std::to_string(all[r].size() / 8) + " settings, rank 0 " +
                                         std::to_string(bytes.size() / 8) + ": not the same model or groups");
  auto word = [&](std::size_t r, std::size_t i) {
    std::uint64_t w;
    std::memcpy(&w, all[r].data() + 8 * i, 8);
    return w;
  };
  for (std::size_t i = 0; i < settings.size(); ++i) {
    std::string ranks;
    std::size_t differ = 0;
    for (std::size_t r = 1; r < all.size(); ++r)
      if (word(r, i) != word(0, i) && ++differ <= 8)
        ranks += ", rank " + std::to_string(r) + " has " + settings[i].show(word(r, i));
    if (differ > 8) ranks += " (and " + std::to_string(differ - 8) + " more ranks)";
    if (differ) differences += "\n  " + settings[i].name + ": rank 0 has " + settings[i].show(word(0, i)) + ranks;
  }
  return all;
}
}  // namespace detail

// Collective: every rank's recorded settings equal rank 0's, or every rank throws the same error
// (`what`: the operation, e.g. "checkpoint save to 'DIR'"), listing every setting that differs.
// One exchange of a few words; a second, of two words per parameter, only when the parameters'
// flags differ somewhere (every rank sees that, so every rank makes it).
template <class Engine>
void check_recorded_settings(Engine& eng, const std::string& what) {
  const auto run = detail::run_settings(eng);
  const auto params = detail::parameter_settings(eng);
  std::string differences;
  const auto all = detail::exchange_settings(eng, run, {detail::hash_of(params)}, differences, what);
  bool flags_differ = false;
  for (const auto& r : all)
    flags_differ = flags_differ || std::memcmp(r.data() + 8 * run.size(), all[0].data() + 8 * run.size(), 8) != 0;
  if (flags_differ) detail::exchange_settings(eng, params, {}, differences, what);
  if (!differences.empty())
    throw error(error_kind::usage,
                what + ": ranks disagree on what the checkpoint records (nothing was written):" + differences,
                "set the learning rates (set_lr), run counters (restore_run_counters) and trainable flags alike on "
                "every rank, at the same point of the training loop, before saving");
}

}  // namespace zshard::checkpoint

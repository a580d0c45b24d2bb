#pragma once
// What a checkpoint of the main job records about the run that saved it (its user_state: the
// options that decide the data and the update), and what a resumed run says about it: which
// saved values it keeps, which of its options change them, and whether it continues bit for
// bit. The engine state itself (parameters, AdamW moments and update counts, step, learning
// rate, loss scale) is the checkpoint's; these lines only explain it.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "train_options.hpp"

namespace gpt {

struct run_record {
  static constexpr const char* header = "02_train_gpt run 2";
  bool known = false;  // false: a checkpoint of an older 02_train_gpt, which recorded only the step
  int step = 0, ranks = 0, batch = 0, micro = 0;
  std::uint64_t seed = 0;
  std::string data;   // "synthetic" or the --text file
  double clip = 0;
  std::string precision;  // f32, bf16 or f16

  static run_record of(const train_options& o, int step, int world, zshard::dtype type) {
    return {true, step, world, o.batch, o.micro_batches, o.seed, o.text.empty() ? "synthetic" : o.text, o.clip,
            std::string(zshard::to_string(type))};
  }

  std::string to_text() const {
    std::ostringstream s;
    s.precision(17);
    s << header << "\nstep " << step << "\nranks " << ranks << "\nbatch " << batch << "\nmicro " << micro << "\nseed "
      << seed << "\nclip " << clip << "\nprecision " << precision << "\ndata " << data << "\n";
    return s.str();
  }

  // Reads to_text()'s lines; anything else (an older example's "step N") is an unknown record.
  static run_record parse(const std::string& text) {
    run_record r;
    std::istringstream in(text);
    std::string line;
    if (!std::getline(in, line) || line != header) return r;
    while (std::getline(in, line)) {
      const auto sp = line.find(' ');
      if (sp == std::string::npos) continue;
      const std::string key = line.substr(0, sp), value = line.substr(sp + 1);
      std::istringstream v(value);
      if (key == "step") v >> r.step;
      else if (key == "ranks") v >> r.ranks;
      else if (key == "batch") v >> r.batch;
      else if (key == "micro") v >> r.micro;
      else if (key == "seed") v >> r.seed;
      else if (key == "clip") v >> r.clip;
      else if (key == "precision") r.precision = value;
      else if (key == "data") r.data = value;
    }
    r.known = r.ranks > 0 && r.batch > 0 && r.micro > 0;
    return r;
  }
};

// The lines a resumed run prints under "resumed from ...": kept, changed, and what holds.
// `saved_lr` is the learning rate the checkpoint restored; `now` is this run's record.
inline std::vector<std::string> describe_resume(const run_record& saved, const run_record& now, float saved_lr,
                                                const train_options& o) {
  std::vector<std::string> out;
  const auto show = [](double x) { return detail::show(x); };
  const bool new_lr = o.was_given("--lr") && o.lr != saved_lr;
  out.push_back("  kept from the checkpoint: parameters, AdamW moments and update counts, step " +
                std::to_string(now.step) + ", loss-scale state" +
                (new_lr ? std::string() : ", learning rate " + show(saved_lr)));
  std::vector<std::string> changed;
  if (new_lr)
    changed.push_back("--lr " + show(o.lr) + " replaces the saved learning rate " + show(saved_lr));
  if (!saved.known) {
    out.push_back("  the checkpoint does not record the options it was saved with (an older 02_train_gpt): "
                  "this run's --batch, --micro, --seed, data and --clip apply as given");
    for (const auto& c : changed) out.push_back("  changed by this run's options: " + c);
    return out;
  }
  if (now.seed != saved.seed)
    changed.push_back("--seed " + std::to_string(now.seed) + " (saved " + std::to_string(saved.seed) +
                      "): other data from here on");
  if (now.data != saved.data) changed.push_back("data " + now.data + " (saved " + saved.data + ")");
  if (now.clip != saved.clip) changed.push_back("--clip " + show(now.clip) + " (saved " + show(saved.clip) + ")");
  if (now.precision != saved.precision)
    changed.push_back("working precision " + now.precision + " (saved " + saved.precision +
                      "): the f32 masters are kept, working values converted");
  const long long g_saved = 1LL * saved.ranks * saved.batch * saved.micro, g_now = 1LL * now.ranks * now.batch * now.micro;
  const auto split = [](const run_record& r) {
    return std::to_string(r.ranks) + " rank(s) x " + std::to_string(r.batch) + " x " + std::to_string(r.micro);
  };
  const bool same_split = saved.ranks == now.ranks && saved.batch == now.batch && saved.micro == now.micro;
  if (g_now != g_saved)
    changed.push_back("global batch " + std::to_string(g_now) + " sequences (" + split(now) + "; saved " +
                      std::to_string(g_saved) + " = " + split(saved) + "): other batches than the saved run's");
  for (const auto& c : changed) out.push_back("  changed by this run's options: " + c);
  if (changed.empty() && same_split)
    out.push_back("  same options and split of the batch: the run continues bit for bit as if never stopped");
  else if (changed.empty())
    out.push_back("  the same global batches of " + std::to_string(g_now) + " sequences, split " + split(now) +
                  " instead of " + split(saved) +
                  ": the gradient sums are grouped differently, so the run matches the uninterrupted one to "
                  "rounding, not necessarily bit for bit");
  return out;
}

}  // namespace gpt

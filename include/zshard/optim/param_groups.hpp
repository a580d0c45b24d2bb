#pragma once
// Parameter groups, as torch.optim's param_groups: each group has its own learning rate and
// weight decay, and a schedule sets the learning rate per group (engine::set_lr(group, lr)).
//
// A group names its parameters (by name) or matches them with a predicate; a parameter in no
// group is in the "default" group (index 0), whose lr and weight decay are adamw_config's. A
// parameter registered with decay = false (biases, norm gains) gets no weight decay in any
// group, as before groups existed. A parameter claimed by two groups is a configuration error.
//
// The Offloaders resolve one adamw_step per (group, decay) slot per step, so a step costs
// O(groups), not O(parameters), of host work beyond the update itself.
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zshard/core/error.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/optim/adamw.hpp"

namespace zshard::optim {

// Every member has a default, so a designated initializer may leave any out without a
// -Wmissing-field-initializers warning.
struct param_group {
  std::string name{};
  std::vector<std::string> params{};               // parameter names in this group
  std::function<bool(const param_spec&)> match{};  // and/or: every parameter it returns true for
  std::optional<float> lr{};                       // unset: adamw_config::lr
  std::optional<float> weight_decay{};             // unset: adamw_config::weight_decay
};

class param_groups {
 public:
  param_groups() = default;
  // Resolves every parameter's group once; `base` supplies the default group's values.
  param_groups(const model_spec& spec, const std::vector<param_group>& groups, const adamw_config& base) {
    names_.push_back("default");
    lr_.push_back(base.lr);
    wd_.push_back(base.weight_decay);
    group_of_.assign(spec.params().size(), 0);
    for (const auto& g : groups) {
      ZSHARD_REQUIRE(!g.name.empty(), error_kind::config, "a parameter group needs a name");
      for (const auto& n : names_)
        ZSHARD_REQUIRE(n != g.name, error_kind::config, "parameter group '" + g.name + "' is defined twice",
                       "give every group its own name ('default' holds the parameters no group claims)");
      const auto index = static_cast<std::uint32_t>(names_.size());
      names_.push_back(g.name);
      lr_.push_back(g.lr.value_or(base.lr));
      wd_.push_back(g.weight_decay.value_or(base.weight_decay));
      check_values(index);
      std::size_t claimed = 0;
      auto claim = [&](param_id p) {
        const std::uint32_t prev = group_of_[p];
        ZSHARD_REQUIRE(
            prev == 0 || prev == index, error_kind::config,
            "parameter '" + spec.param(p).name + "' is in parameter groups '" + names_[prev] + "' and '" + g.name + "'",
            "put each parameter in one group");
        if (prev == 0) ++claimed;
        group_of_[p] = index;
      };
      for (const auto& n : g.params) claim(spec.param_by_name(n));
      if (g.match)
        for (param_id p = 0; p < spec.params().size(); ++p)
          if (g.match(spec.param(p))) claim(p);
      ZSHARD_REQUIRE(claimed > 0, error_kind::config, "parameter group '" + g.name + "' has no parameters",
                     "name its parameters in `params` or give it a `match` that selects some");
    }
  }

  std::size_t size() const noexcept { return names_.size(); }
  std::uint32_t group_of(param_id p) const noexcept { return group_of_[p]; }
  const std::string& name(std::size_t g) const { return names_.at(g); }
  std::size_t index_of(std::string_view name) const {
    for (std::size_t g = 0; g < names_.size(); ++g)
      if (names_[g] == name) return g;
    throw error(error_kind::usage, "no parameter group named '" + std::string(name) + "'",
                "use a name from engine_config::param_groups, or 'default'");
  }

  float lr(std::size_t g) const { return lr_.at(g); }
  float weight_decay(std::size_t g) const { return wd_.at(g); }
  void set_lr(std::size_t g, float lr) {
    ZSHARD_REQUIRE(std::isfinite(lr) && lr > 0, error_kind::config,
                   "learning rate " + std::to_string(lr) + " for group '" + name(g) + "' must be positive and finite");
    lr_.at(g) = lr;
  }

  // One AdamW step per (group, decay) pair: slot(p) indexes the vector steps() fills.
  std::size_t slot_count() const noexcept { return 2 * names_.size(); }
  std::size_t slot(param_id p, bool decay) const noexcept { return 2 * std::size_t(group_of_[p]) + (decay ? 1 : 0); }
  void steps(const adamw_config& base, std::int64_t step, float grad_scale, std::vector<adamw_step>& out) const {
    out.resize(slot_count());
    adamw_config c = base;
    for (std::size_t g = 0; g < names_.size(); ++g) {
      c.lr = lr_[g];
      c.weight_decay = wd_[g];
      out[2 * g] = make_adamw_step(c, step, grad_scale, false);
      out[2 * g + 1] = make_adamw_step(c, step, grad_scale, true);
    }
  }
  adamw_step step_for(param_id p, bool decay, const adamw_config& base, std::int64_t step, float grad_scale) const {
    adamw_config c = base;
    c.lr = lr_[group_of_[p]];
    c.weight_decay = wd_[group_of_[p]];
    return make_adamw_step(c, step, grad_scale, decay);
  }

  // What must agree across ranks, folded into the engine's construction-time settings check
  // (engine/settings_check.hpp): each group's name and members, and each group's learning rate
  // and weight decay, as 64-bit hashes.
  std::uint64_t members_hash() const noexcept {
    std::uint64_t h = 0x84222325cbf29ce4ull;
    for (const auto& n : names_)
      for (char c : n) mix(h, std::uint8_t(c));
    mix(h, 0x100);  // ends a name
    for (auto g : group_of_) mix(h, g);
    return h;
  }
  std::uint64_t lr_hash() const noexcept {
    std::uint64_t h = 0x84222325cbf29ce4ull;
    for (float x : lr_) mix(h, bits(x));
    return h;
  }
  std::uint64_t weight_decay_hash() const noexcept {
    std::uint64_t h = 0x84222325cbf29ce4ull;
    for (float x : wd_) mix(h, bits(x));
    return h;
  }

 private:
  static std::uint64_t bits(float f) noexcept { return std::bit_cast<std::uint32_t>(f); }
  static void mix(std::uint64_t& h, std::uint64_t v) noexcept { h = (h ^ v) * 0x100000001b3ull; }
  void check_values(std::size_t g) const {
    ZSHARD_REQUIRE(std::isfinite(lr_[g]) && lr_[g] > 0, error_kind::config,
                   "parameter group '" + names_[g] + "' has learning rate " + std::to_string(lr_[g]),
                   "use a positive, finite learning rate");
    ZSHARD_REQUIRE(std::isfinite(wd_[g]) && wd_[g] >= 0, error_kind::config,
                   "parameter group '" + names_[g] + "' has weight decay " + std::to_string(wd_[g]),
                   "use 0 to turn decay off, or a value such as 0.01 or 0.1");
  }

  std::vector<std::string> names_;
  std::vector<float> lr_, wd_;
  std::vector<std::uint32_t> group_of_;  // per parameter
};

}  // namespace zshard::optim

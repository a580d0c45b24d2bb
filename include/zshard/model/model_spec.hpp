#pragma once
// What the engine shards: named parameters (shape, working dtype, trainable or frozen, weight
// decay or not, a deterministic initialiser) and the modules that use them. A parameter may be
// listed by several modules (tied embeddings); the engine then treats its gradient as complete
// only after every counted use's backward has run.
//
// Initialisation is a function of the global element index, so the model is identical
// whatever the world size: rank r initialises exactly the elements of its shard.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "zshard/core/checked_size.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/shape.hpp"
#include "zshard/model/init.hpp"

namespace zshard {

using param_id = std::uint32_t;
using module_id = std::uint32_t;

struct param_options {
  std::optional<dtype> type;  // working dtype; unset: the engine config's param_dtype
  bool trainable = true;      // frozen parameters get no gradient and no optimizer state
  bool decay = true;          // AdamW weight decay applies (off for biases and norm gains)
  initializer init{};         // empty: normal(0, 0.02) seeded by the parameter's name
};

struct param_spec {
  std::string name;
  zshard::shape shape;
  std::optional<dtype> type;
  bool trainable;
  bool decay;
  initializer init;
  std::size_t numel() const noexcept { return static_cast<std::size_t>(shape.numel()); }
};

struct module_spec {
  std::string name;
  std::vector<param_id> params;
};

class model_spec {
 public:
  param_id add_param(const std::string& name, zshard::shape s, param_options opt = {}) {
    ZSHARD_REQUIRE(!name.empty(), error_kind::config, "a parameter needs a name");
    ZSHARD_REQUIRE(s.numel() > 0, error_kind::config, "parameter '" + name + "' has no elements",
                   "give every parameter a non-empty shape");
    ZSHARD_REQUIRE(!param_index_.contains(name), error_kind::config, "parameter '" + name + "' is registered twice",
                   "register each parameter once and list its id in every module that uses it (shared weights)");
    if (!opt.init) opt.init = init::normal(0.0f, 0.02f, hash_name(name));
    const auto id = static_cast<param_id>(params_.size());
    params_.push_back({name, s, opt.type, opt.trainable, opt.decay, std::move(opt.init)});
    param_index_.emplace(name, id);
    return id;
  }

  module_id add_module(const std::string& name, std::vector<param_id> params) {
    ZSHARD_REQUIRE(!name.empty(), error_kind::config, "a module needs a name");
    ZSHARD_REQUIRE(!module_index_.contains(name), error_kind::config, "module '" + name + "' is registered twice");
    // Duplicates through a hash set: linear in the module's parameters (a module of thousands
    // of parameters, a flattened model say, must not cost a quadratic scan).
    std::unordered_set<param_id> seen;
    seen.reserve(params.size());
    for (param_id p : params) {
      ZSHARD_REQUIRE(p < params_.size(), error_kind::config,
                     "module '" + name + "' names parameter id " + std::to_string(p) + " which does not exist");
      ZSHARD_REQUIRE(seen.insert(p).second, error_kind::config,
                     "module '" + name + "' lists parameter '" + params_[p].name + "' twice");
    }
    const auto id = static_cast<module_id>(modules_.size());
    modules_.push_back({name, std::move(params)});
    module_index_.emplace(name, id);
    return id;
  }

  const std::vector<param_spec>& params() const noexcept { return params_; }
  const std::vector<module_spec>& modules() const noexcept { return modules_; }
  // Checked: an id out of range is a usage error (the check is one compare on this hot path;
  // the message is built out of line).
  const param_spec& param(param_id p) const {
    if (p >= params_.size()) [[unlikely]]
      no_such("parameter", p, params_.size());
    return params_[p];
  }
  const module_spec& module(module_id m) const {
    if (m >= modules_.size()) [[unlikely]]
      no_such("module", m, modules_.size());
    return modules_[m];
  }

  // Freezes or unfreezes a registered parameter. An engine's copy changes only through
  // engine::set_trainable (between steps, on every rank); before an engine exists, set it here.
  void set_trainable(param_id p, bool trainable) {
    param(p);  // the range check
    params_[p].trainable = trainable;
  }

  param_id param_by_name(const std::string& name) const {
    auto it = param_index_.find(name);
    ZSHARD_REQUIRE(it != param_index_.end(), error_kind::config, "no parameter named '" + name + "'");
    return it->second;
  }
  module_id module_by_name(const std::string& name) const {
    auto it = module_index_.find(name);
    ZSHARD_REQUIRE(it != module_index_.end(), error_kind::config, "no module named '" + name + "'");
    return it->second;
  }

  std::size_t total_numel() const {
    std::size_t n = 0;
    for (const auto& p : params_) n = checked_add(n, p.numel(), "model size");
    return n;
  }

  // Every parameter must be used by some module (otherwise it is never gathered and never
  // gets a gradient: almost certainly a registration mistake).
  void validate() const {
    ZSHARD_REQUIRE(!modules_.empty(), error_kind::config, "the model has no modules");
    std::vector<bool> used(params_.size(), false);
    for (const auto& m : modules_)
      for (param_id p : m.params) used[p] = true;
    for (std::size_t p = 0; p < params_.size(); ++p)
      ZSHARD_REQUIRE(used[p], error_kind::config, "parameter '" + params_[p].name + "' is used by no module",
                     "list it in the module(s) that use it, or do not register it");
  }

  // A hash of everything that must agree across ranks: names, shapes, dtypes, flags, module
  // structure. The engine compares it across ranks at construction.
  std::uint64_t fingerprint() const noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](std::uint64_t v) {
      h ^= v;
      h *= 0x100000001b3ull;
    };
    for (const auto& p : params_) {
      mix(hash_name(p.name));
      for (int i = 0; i < p.shape.rank(); ++i) mix(static_cast<std::uint64_t>(p.shape[i]));
      mix(p.type ? static_cast<std::uint64_t>(*p.type) + 1 : 0);
      mix((p.trainable ? 1u : 0u) | (p.decay ? 2u : 0u));
    }
    for (const auto& m : modules_) {
      mix(hash_name(m.name));
      for (param_id p : m.params) mix(p);
      mix(~0ull);
    }
    return h;
  }

 private:
  [[noreturn, gnu::cold, gnu::noinline]] static void no_such(const char* what, std::size_t id, std::size_t count) {
    throw error(error_kind::usage, std::string(what) + " id " + std::to_string(id) + " does not exist: the model has " +
                                       std::to_string(count) + " " + what + "s",
                "pass an id returned by this model_spec's add_" + std::string(what == std::string("module") ? "module" : "param") + "()");
  }

  std::vector<param_spec> params_;
  std::vector<module_spec> modules_;
  std::unordered_map<std::string, param_id> param_index_;
  std::unordered_map<std::string, module_id> module_index_;
};

}  // namespace zshard

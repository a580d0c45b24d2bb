#pragma once
// What the engine shards: named parameters (shape, working dtype, trainable or frozen, weight
// decay or not, a deterministic initialiser) and the modules that use them. A parameter may be
// listed by several modules (tied embeddings); the engine then treats its gradient as complete
// only after every counted use's backward has run.
//
// Every spec has a process-unique serial, and the ids it hands out carry it (model/spec_id.hpp):
// an id of another spec is a usage error wherever an id is taken, even when its index is in
// range. A copy keeps the serial of its source: it describes the same model (an engine keeps a
// copy of the spec it was built on, and the user's ids must work on it). A moved-to spec takes
// the serial over; the moved-from spec is empty and gets a fresh serial. A copy that is then
// extended with more parameters or modules still shares its source's serial: ids are checked
// by serial and range only.
//
// A spec may carry a name (`model_spec spec("student")` or set_name): messages then say
// "model_spec 'student' (#3)" where they would say "model_spec #3", for the ids of another
// model, ranks that disagree on the model and checkpoints of another model. The name is a
// label: it is not part of the fingerprint, so ranks and checkpoints may name a model
// differently. Copies keep it (the same model); a moved-from spec loses it.
//
// Initialisation is a function of the global element index, so the model is identical
// whatever the world size: rank r initialises exactly the elements of its shard.
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "zshard/core/checked_size.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/shape.hpp"
#include "zshard/model/init.hpp"
#include "zshard/model/spec_id.hpp"

namespace zshard {

// Every member has a default (`{}` included): designated initializers that set only some of
// them compile without -Wmissing-field-initializers warnings (g++ 12 warns for a member without one).
struct param_options {
  std::optional<dtype> type{};  // working dtype; unset: the engine config's param_dtype
  bool trainable = true;        // frozen parameters get no gradient and no optimizer state
  bool decay = true;            // AdamW weight decay applies (off for biases and norm gains)
  initializer init{};           // empty: normal(0, 0.02) seeded by the parameter's name
  // 2-D only: safetensors files (export, load_pretrained) hold its transpose. For a linear
  // weight the model keeps as (in, out), to compute x @ W: files then hold torch's (out, in).
  bool file_transposed = false;
};

struct param_spec {
  std::string name;
  zshard::shape shape;
  std::optional<dtype> type;
  bool trainable;
  bool decay;
  initializer init;
  bool file_transposed = false;  // param_options::file_transposed
  std::size_t numel() const noexcept { return static_cast<std::size_t>(shape.numel()); }
};

struct module_spec {
  std::string name;
  std::vector<param_id> params;
};

class model_spec {
 public:
  model_spec() = default;
  explicit model_spec(std::string name) { set_name(std::move(name)); }
  model_spec(const model_spec&) = default;  // the same model: keeps the serial, so its ids stay valid
  model_spec& operator=(const model_spec&) = default;
  model_spec(model_spec&& o) noexcept
      : serial_(o.serial_),
        name_(std::move(o.name_)),
        params_(std::move(o.params_)),
        modules_(std::move(o.modules_)),
        param_index_(std::move(o.param_index_)),
        module_index_(std::move(o.module_index_)) {
    o.reset_moved_from();
  }
  model_spec& operator=(model_spec&& o) noexcept {
    if (this != &o) {
      serial_ = o.serial_;
      name_.swap(o.name_);  // o's is cleared below
      params_ = std::move(o.params_);
      modules_ = std::move(o.modules_);
      param_index_ = std::move(o.param_index_);
      module_index_ = std::move(o.module_index_);
      o.reset_moved_from();
    }
    return *this;
  }
  ~model_spec() = default;

  // This spec's identity: process-unique, shared by its copies, never 0 (param_id::unbound).
  std::uint32_t serial() const noexcept { return serial_; }

  // The name messages give this model (empty: none). Renaming a copy renames the model its
  // source's ids belong to as well, in messages about those ids.
  void set_name(std::string name) {
    name_ = std::move(name);
    auto& r = registry();
    const std::lock_guard lock(r.mutex);
    if (name_.empty())
      r.names.erase(serial_);
    else
      r.names[serial_] = name_;
  }
  const std::string& name() const noexcept { return name_; }
  // How messages name this spec: "model_spec 'student' (#3)", or "model_spec #3" unnamed.
  std::string label() const { return label_of(serial_, name_); }

  param_id add_param(const std::string& name, zshard::shape s, param_options opt = {}) {
    ZSHARD_REQUIRE(!name.empty(), error_kind::config, "a parameter needs a name");
    ZSHARD_REQUIRE(s.numel() > 0, error_kind::config, "parameter '" + name + "' has no elements",
                   "give every parameter a non-empty shape");
    ZSHARD_REQUIRE(!param_index_.contains(name), error_kind::config, "parameter '" + name + "' is registered twice",
                   "register each parameter once and list its id in every module that uses it (shared weights)");
    ZSHARD_REQUIRE(!opt.file_transposed || s.rank() == 2, error_kind::config,
                   "parameter '" + name + "' has file_transposed set but shape " + s.to_string(),
                   "file_transposed is for 2-D weights (files hold the transpose); leave it off for this parameter");
    if (!opt.init) opt.init = init::normal(0.0f, 0.02f, hash_name(name));
    ZSHARD_REQUIRE(params_.size() < std::uint32_t(-1), error_kind::config, "too many parameters");
    const param_id id(static_cast<std::uint32_t>(params_.size()), serial_);
    params_.push_back({name, s, opt.type, opt.trainable, opt.decay, std::move(opt.init), opt.file_transposed});
    param_index_.emplace(name, id);
    return id;
  }

  module_id add_module(const std::string& name, std::vector<param_id> params) {
    ZSHARD_REQUIRE(!name.empty(), error_kind::config, "a module needs a name");
    ZSHARD_REQUIRE(!module_index_.contains(name), error_kind::config, "module '" + name + "' is registered twice");
    // Duplicates through a hash set: linear in the module's parameters (a module of thousands
    // of parameters, a flattened model say, must not cost a quadratic scan).
    std::unordered_set<std::uint32_t> seen;
    seen.reserve(params.size());
    for (param_id& p : params) {
      if (p.bound() && p.spec_serial() != serial_) [[unlikely]]
        foreign("add_module('" + name + "')", "parameter", p.index(), p.spec_serial(), params_.size());
      ZSHARD_REQUIRE(p < params_.size(), error_kind::config,
                     "module '" + name + "' names parameter id " + std::to_string(p) + " which does not exist");
      ZSHARD_REQUIRE(seen.insert(p).second, error_kind::config,
                     "module '" + name + "' lists parameter '" + params_[p].name + "' twice");
      p = param_id(p.index(), serial_);  // module(m).params hands out bound ids
    }
    ZSHARD_REQUIRE(modules_.size() < std::uint32_t(-1), error_kind::config, "too many modules");
    const module_id id(static_cast<std::uint32_t>(modules_.size()), serial_);
    modules_.push_back({name, std::move(params)});
    module_index_.emplace(name, id);
    return id;
  }

  const std::vector<param_spec>& params() const noexcept { return params_; }
  const std::vector<module_spec>& modules() const noexcept { return modules_; }
  // The ids of every parameter / module, bound to this spec: `for (param_id p : spec.param_ids())`.
  id_range<param_id> param_ids() const noexcept {
    return {param_id(0, serial_), static_cast<std::uint32_t>(params_.size())};
  }
  id_range<module_id> module_ids() const noexcept {
    return {module_id(0, serial_), static_cast<std::uint32_t>(modules_.size())};
  }

  // The checks every entry point that takes an id makes: a bound id must come from this spec
  // (or a copy of it), and any id must be in range; otherwise a usage error that names `where`.
  // Both are a compare or two on hot paths (the scopes); the messages are built out of line.
  // Returns the id bound to this spec.
  param_id check(param_id p, const char* where = "model_spec::param") const {
    check_owner(p, where);
    if (p.index() >= params_.size()) [[unlikely]]
      no_such(where, "parameter", p.index(), params_.size());
    return param_id(p.index(), serial_);
  }
  module_id check(module_id m, const char* where = "model_spec::module") const {
    check_owner(m, where);
    if (m.index() >= modules_.size()) [[unlikely]]
      no_such(where, "module", m.index(), modules_.size());
    return module_id(m.index(), serial_);
  }

  // The identity half alone (for callers that report ranges themselves, as the planner does).
  void check_owner(param_id p, const char* where) const {
    if (p.bound() && p.spec_serial() != serial_) [[unlikely]]
      foreign(where, "parameter", p.index(), p.spec_serial(), params_.size());
  }
  void check_owner(module_id m, const char* where) const {
    if (m.bound() && m.spec_serial() != serial_) [[unlikely]]
      foreign(where, "module", m.index(), m.spec_serial(), modules_.size());
  }

  // Checked as above.
  const param_spec& param(param_id p) const { return params_[check(p, "model_spec::param").index()]; }
  const module_spec& module(module_id m) const { return modules_[check(m, "model_spec::module").index()]; }

  // Freezes or unfreezes a registered parameter. An engine's copy changes only through
  // engine::set_trainable (between steps, on every rank); before an engine exists, set it here.
  void set_trainable(param_id p, bool trainable) {
    params_[check(p, "model_spec::set_trainable").index()].trainable = trainable;
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
      for (param_id p : m.params) mix(p.index());  // indices only: the serial differs between ranks' specs
      mix(~0ull);
    }
    return h;
  }

 private:
  static std::uint32_t next_serial() noexcept {
    static std::atomic<std::uint32_t> counter{0};
    std::uint32_t s = counter.fetch_add(1, std::memory_order_relaxed) + 1;
    if (s == param_id::unbound) s = counter.fetch_add(1, std::memory_order_relaxed) + 1;  // after 2^32 specs
    return s;
  }

  void reset_moved_from() noexcept {
    serial_ = next_serial();  // empty now: the ids of the model it held belong to the moved-to spec
    name_.clear();
    params_.clear();
    modules_.clear();
    param_index_.clear();
    module_index_.clear();
  }

  // The names specs were given, by serial: a message about an id of another spec names that
  // spec too. Written by set_name only; read on error paths. A serial's entry outlives its
  // specs (one short string per named model).
  struct name_registry {
    std::mutex mutex;
    std::unordered_map<std::uint32_t, std::string> names;
  };
  static name_registry& registry() {
    static name_registry r;
    return r;
  }
  static std::string label_of(std::uint32_t serial, const std::string& name) {
    const std::string number = "#" + std::to_string(serial);
    return name.empty() ? "model_spec " + number : "model_spec '" + name + "' (" + number + ")";
  }
  static std::string label_of(std::uint32_t serial) {
    auto& r = registry();
    const std::lock_guard lock(r.mutex);
    const auto it = r.names.find(serial);
    return label_of(serial, it == r.names.end() ? std::string() : it->second);
  }

  static std::string add_fn(const char* what) {
    return std::string(what) == "module" ? "add_module()/module_by_name()/module_ids()"
                                         : "add_param()/param_by_name()/param_ids()";
  }

  [[noreturn, gnu::cold, gnu::noinline]] static void no_such(const char* where, const char* what, std::size_t id,
                                                             std::size_t count) {
    throw error(error_kind::usage,
                std::string(where) + ": " + what + " id " + std::to_string(id) + " does not exist: the model has " +
                    std::to_string(count) + " " + what + "s",
                "pass an id returned by this model_spec's " + add_fn(what));
  }

  [[noreturn, gnu::cold, gnu::noinline]] void foreign(std::string_view where, const char* what, std::size_t id,
                                                      std::uint32_t other, std::size_t count) const {
    throw error(error_kind::usage,
                std::string(where) + ": " + what + " id " + std::to_string(id) + " belongs to " + label_of(other) +
                    ", not to " + label() + " (this one, " + std::to_string(count) + " " + what +
                    "s) that it was passed to: an id of another model names a " + "different " + what + " here",
                "use the ids returned by this engine's model_spec (" + add_fn(what) +
                    " of the spec the engine was built on, or of a copy of it); an id made from a bare number "
                    "(param_id{i}) is only range-checked");
  }

  std::uint32_t serial_ = next_serial();
  std::string name_;
  std::vector<param_spec> params_;
  std::vector<module_spec> modules_;
  std::unordered_map<std::string, param_id> param_index_;
  std::unordered_map<std::string, module_id> module_index_;
};

}  // namespace zshard

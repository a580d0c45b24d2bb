#pragma once
// A training schedule as a text file, with the model and the settings it is planned for, so
// that tools/zshard_plan can plan any model without C++ (docs/schedule_format.md has the full
// description). One statement per line; '#' starts a comment; counts take 5e8 or 500000000.
//
//   zshard-schedule 1                      first line, the format's version
//   world 8                                settings (each optional; defaults as engine_config)
//   param_dtype bf16                       bf16 | f16 | f32
//   max_live_numel 1e9 / prefetch_numel 5e7 / max_reuse_distance 0 / reduce_bucket_numel 5e8
//   persistence_threshold_numel 0 / shard_alignment_numel 1 / allow_oversized_module on|off
//   optimizer device|host
//   param NAME DIMxDIMx... [bf16|f16|f32] [frozen] [no_decay]   (1 to 4 dimensions)
//   module NAME [PARAM ...]                 the parameters it uses (shared ones in several modules)
//   step NAME [xN]                          a step program; xN: N copies in a row in the cycle
//     forward|no_grad|recompute|backward MODULE      a scope opened and closed at once
//     open forward|no_grad|recompute|backward MODULE a scope left open (nesting) ...
//     close forward|no_grad|recompute|backward MODULE ... until closed
//     begin_backward / end_backward
//     activations BYTES                    report_activations(BYTES)
//     gather_param PARAM / export
//   end
//
// write_schedule_file() writes the same format (a recording, say), read_schedule_file() reads
// it; errors name the line.
#include <cmath>
#include <istream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "zshard/core/read_number.hpp"
#include "zshard/engine/engine_config.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/plan/plan_result.hpp"
#include "zshard/plan/schedule.hpp"

namespace zshard::plan {

struct schedule_file {
  model_spec spec;
  engine_config cfg;
  int world = 1;
  optimizer_location optimizer = optimizer_location::device;
  training_schedule schedule;
};

namespace detail {

inline std::vector<std::string> words(const std::string& line) {
  std::istringstream is(line.substr(0, line.find('#')));
  std::vector<std::string> w;
  for (std::string s; is >> s;) w.push_back(s);
  return w;
}

// The file's words for scope kinds and dtypes are the names zshard prints (to_string): `out`
// becomes the value among `values` named `w`, if any.
template <class E, std::size_t N>
bool named(const std::string& w, const E (&values)[N], E& out) {
  for (E e : values)
    if (w == to_string(e)) {
      out = e;
      return true;
    }
  return false;
}
inline constexpr scope_kind scope_kinds[] = {scope_kind::forward, scope_kind::no_grad, scope_kind::recompute,
                                             scope_kind::backward};
inline constexpr dtype dtypes[] = {dtype::bf16, dtype::f16, dtype::f32};

// The engine settings the file holds as counts, by their word, in the order they are written:
// one list for reading and writing.
struct count_setting {
  const char* word;
  std::size_t& (*of)(engine_config&);
};
inline constexpr count_setting count_settings[] = {
    {"max_live_numel", [](engine_config& c) -> std::size_t& { return c.prefetch.max_live_numel; }},
    {"prefetch_numel", [](engine_config& c) -> std::size_t& { return c.prefetch.prefetch_numel; }},
    {"max_reuse_distance", [](engine_config& c) -> std::size_t& { return c.prefetch.max_reuse_distance; }},
    {"reduce_bucket_numel", [](engine_config& c) -> std::size_t& { return c.reduce.reduce_bucket_numel; }},
    {"persistence_threshold_numel",
     [](engine_config& c) -> std::size_t& { return c.partition.persistence_threshold_numel; }},
    {"shard_alignment_numel", [](engine_config& c) -> std::size_t& { return c.partition.shard_alignment_numel; }},
};
inline const count_setting* count_setting_named(const std::string& w) {
  for (const auto& s : count_settings)
    if (w == s.word) return &s;
  return nullptr;
}

}  // namespace detail

inline schedule_file read_schedule_file(std::istream& in, const std::string& source = "schedule") {
  schedule_file f;
  int line_no = 0;
  auto fail = [&](const std::string& what) -> void {
    throw error(error_kind::config, source + ":" + std::to_string(line_no) + ": " + what,
                "see docs/schedule_format.md for the format");
  };
  auto count = [&](const std::string& v) -> std::size_t {
    const std::optional<std::size_t> n = read_count(v);
    if (!n) fail("'" + v + "' is not a whole non-negative count");
    return *n;
  };
  auto on_off = [&](const std::string& v) {
    if (v != "on" && v != "off") fail("expected on or off, not '" + v + "'");
    return v == "on";
  };
  std::map<std::string, module_id> modules;
  std::map<std::string, param_id> params;
  auto module_named = [&](const std::string& n) {
    auto it = modules.find(n);
    if (it == modules.end()) fail("no module named '" + n + "' (declare it with `module` first)");
    return it->second;
  };
  step_program* step = nullptr;
  int copies = 1;
  bool header = false;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    const auto w = detail::words(line);
    if (w.empty()) continue;
    const std::string& k = w[0];
    if (!header) {
      if (w.size() != 2 || k != "zshard-schedule" || w[1] != "1")
        fail("the first statement must be `zshard-schedule 1`");
      header = true;
      continue;
    }
    auto need = [&](std::size_t n) {
      if (w.size() != n) fail("`" + k + "` takes " + std::to_string(n - 1) + " value(s)");
    };
    if (step) {
      scope_kind sk{};
      if (k == "end") {
        need(1);
        for (int i = 1; i < copies; ++i) f.schedule.cycle.push_back(f.schedule.cycle.back());
        step = nullptr;
      } else if (detail::named(k, detail::scope_kinds, sk)) {
        need(2);
        const module_id m = module_named(w[1]);
        step->events.push_back(schedule_event::open(m, sk));
        step->events.push_back(schedule_event::close(m, sk));
      } else if (k == "open" || k == "close") {
        need(3);
        if (!detail::named(w[1], detail::scope_kinds, sk))
          fail("expected forward, no_grad, recompute or backward, not '" + w[1] + "'");
        const module_id m = module_named(w[2]);
        step->events.push_back(k == "open" ? schedule_event::open(m, sk) : schedule_event::close(m, sk));
      } else if (k == "begin_backward" || k == "end_backward") {
        need(1);
        step->events.push_back(k == "begin_backward" ? schedule_event::begin_backward()
                                                     : schedule_event::end_backward());
      } else if (k == "activations") {
        need(2);
        step->events.push_back(schedule_event::activations(count(w[1])));
      } else if (k == "gather_param") {
        need(2);
        auto it = params.find(w[1]);
        if (it == params.end()) fail("no parameter named '" + w[1] + "'");
        step->events.push_back(schedule_event::gather(it->second));
      } else if (k == "export") {
        need(1);
        step->events.push_back(schedule_event::export_params());
      } else {
        fail("unknown statement '" + k + "' inside a step (missing `end`?)");
      }
      continue;
    }
    if (k == "world") {
      need(2);
      const std::size_t n = count(w[1]);
      if (n < 1 || n > 1'000'000) fail("world must be between 1 and 1e6");
      f.world = int(n);
    } else if (k == "param_dtype") {
      need(2);
      if (!detail::named(w[1], detail::dtypes, f.cfg.param_dtype)) fail("param_dtype takes bf16, f16 or f32");
    } else if (const detail::count_setting* s = detail::count_setting_named(k)) {
      need(2), s->of(f.cfg) = count(w[1]);
    } else if (k == "allow_oversized_module") {
      need(2), f.cfg.prefetch.allow_oversized_module = on_off(w[1]);
    } else if (k == "optimizer") {
      need(2);
      if (w[1] != "device" && w[1] != "host") fail("optimizer takes device or host");
      f.optimizer = w[1] == "host" ? optimizer_location::host : optimizer_location::device;
    } else if (k == "param") {
      if (w.size() < 3) fail("`param` takes a name and a shape such as 4096x4096");
      std::vector<std::int64_t> dims;
      std::istringstream ds(w[2]);
      for (std::string d; std::getline(ds, d, 'x');) {
        const std::size_t n = count(d);
        if (n == 0 || n > (std::size_t{1} << 40)) fail("dimension '" + d + "' of '" + w[1] + "' is out of range");
        dims.push_back(std::int64_t(n));
      }
      if (dims.empty() || dims.size() > std::size_t(shape::max_rank))
        fail("shape '" + w[2] + "' needs 1 to " + std::to_string(shape::max_rank) + " dimensions");
      param_options o;
      for (std::size_t i = 3; i < w.size(); ++i) {
        dtype t{};
        if (detail::named(w[i], detail::dtypes, t))
          o.type = t;
        else if (w[i] == "frozen")
          o.trainable = false;
        else if (w[i] == "no_decay")
          o.decay = false;
        else
          fail("unknown parameter flag '" + w[i] + "' (bf16, f16, f32, frozen, no_decay)");
      }
      try {
        const shape s = dims.size() == 1   ? shape{dims[0]}
                        : dims.size() == 2 ? shape{dims[0], dims[1]}
                        : dims.size() == 3 ? shape{dims[0], dims[1], dims[2]}
                                           : shape{dims[0], dims[1], dims[2], dims[3]};
        params[w[1]] = f.spec.add_param(w[1], s, o);
      } catch (const error& e) {
        fail(e.message());
      }
    } else if (k == "module") {
      if (w.size() < 2) fail("`module` takes a name and its parameters");
      std::vector<param_id> ps;
      for (std::size_t i = 2; i < w.size(); ++i) {
        auto it = params.find(w[i]);
        if (it == params.end()) fail("no parameter named '" + w[i] + "' (declare it with `param` first)");
        ps.push_back(it->second);
      }
      try {
        modules[w[1]] = f.spec.add_module(w[1], ps);
      } catch (const error& e) {
        fail(e.message());
      }
    } else if (k == "step") {
      if (w.size() != 2 && w.size() != 3) fail("`step` takes a name and optionally xN");
      copies = 1;
      if (w.size() == 3) {
        if (w[2].size() < 2 || w[2][0] != 'x') fail("expected xN (copies in a row), not '" + w[2] + "'");
        const std::size_t n = count(w[2].substr(1));
        if (n < 1 || n > 1000) fail("a step repeats 1 to 1000 times");
        copies = int(n);
      }
      f.schedule.cycle.push_back({w[1], {}});
      step = &f.schedule.cycle.back();
    } else {
      fail("unknown statement '" + k + "'");
    }
  }
  if (!header) fail("empty file: the first statement must be `zshard-schedule 1`");
  if (step) fail("step '" + step->name + "' has no `end`");
  try {
    f.spec.validate();
    f.cfg.validate();
    f.schedule.validate(f.spec);
  } catch (const error& e) {
    throw error(e.kind(), source + ": " + e.message(), e.hint());
  }
  return f;
}

// Writes `schedule` with its model and settings; read_schedule_file() reads it back equal.
inline void write_schedule_file(std::ostream& os, const model_spec& spec, const engine_config& cfg, int world,
                                optimizer_location optimizer, const training_schedule& schedule) {
  auto plain = [](const std::string& n) {
    ZSHARD_REQUIRE(n.find_first_of(" \t\n#") == std::string::npos, error_kind::config,
                   "name '" + n + "' has a space or '#', which the schedule file cannot hold",
                   "name parameters and modules without spaces to write them to a schedule file");
  };
  for (const auto& p : spec.params()) plain(p.name);
  for (const auto& m : spec.modules()) plain(m.name);
  os << "zshard-schedule 1\n# written by zshard::plan::write_schedule_file\n";
  os << "world " << world << "\nparam_dtype " << to_string(cfg.param_dtype) << '\n';
  engine_config settings = cfg;  // count_settings reach the fields through a non-const config
  for (const auto& s : detail::count_settings) os << s.word << ' ' << s.of(settings) << '\n';
  os << "allow_oversized_module " << (cfg.prefetch.allow_oversized_module ? "on" : "off") << "\noptimizer "
     << (optimizer == optimizer_location::host ? "host" : "device") << "\n\n";
  for (const auto& p : spec.params()) {
    os << "param " << p.name << ' ';
    for (int i = 0; i < p.shape.rank(); ++i) os << (i ? "x" : "") << p.shape[i];
    if (p.type) os << ' ' << to_string(*p.type);
    if (!p.trainable) os << " frozen";
    if (!p.decay) os << " no_decay";
    os << '\n';
  }
  for (const auto& m : spec.modules()) {
    os << "module " << m.name;
    for (param_id p : m.params) os << ' ' << spec.param(p).name;
    os << '\n';
  }
  for (const auto& s : schedule.cycle) {
    std::string name = s.name;
    for (char& c : name)
      if (c == ' ' || c == '#') c = '_';
    os << "\nstep " << name << '\n';
    for (std::size_t i = 0; i < s.events.size(); ++i) {
      const auto& e = s.events[i];
      switch (e.kind) {
        case event_kind::open:
          if (i + 1 < s.events.size() && s.events[i + 1] == schedule_event::close(e.module, e.scope)) {
            os << "  " << to_string(e.scope) << ' ' << spec.module(e.module).name << '\n';
            ++i;
          } else {
            os << "  open " << to_string(e.scope) << ' ' << spec.module(e.module).name << '\n';
          }
          break;
        case event_kind::close:
          os << "  close " << to_string(e.scope) << ' ' << spec.module(e.module).name << '\n';
          break;
        case event_kind::begin_backward:
          os << "  begin_backward\n";
          break;
        case event_kind::end_backward:
          os << "  end_backward\n";
          break;
        case event_kind::activations:
          os << "  activations " << e.bytes << '\n';
          break;
        case event_kind::gather_param:
          os << "  gather_param " << spec.param(e.param).name << '\n';
          break;
        case event_kind::export_params:
          os << "  export\n";
          break;
      }
    }
    os << "end\n";
  }
}

}  // namespace zshard::plan

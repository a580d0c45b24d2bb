#pragma once
// manifest.json of a sharded checkpoint: what was saved (format and version, the model: names,
// shapes, dtypes, flags, each parameter's layout at save time), by how many ranks, the run
// counters, and every file with its size and CRC32C. A load checks the manifest against the
// engine and the files against the manifest before it changes anything.
//
// Rank q's file, rank-0000q.safetensors, holds for every parameter the elements rank q owned
// at save time (shard_layout::owned_begin/end, padding excluded; a replicated parameter is in
// rank 0's file only): tensor "<name>:working" in the parameter's dtype and, for parameters with
// optimizer state ("optimizer_state": trainable ones, and frozen ones with the state they kept),
// "<name>:master", "<name>:m", "<name>:v" in F32 — each a 1-d tensor. Any rank
// count can read them back (resharding): element g of a parameter lives in the file of the
// rank that owned g.
//
// Format versions (docs/checkpoint_format.md):
//   1  no per-parameter update counts: a load continues every parameter's AdamW count from the
//      run's step, and says so in the log (exact only if no parameter ever skipped a step).
//   2  "update_counts": each parameter's own AdamW update count, in "params" order (a parameter
//      without a gradient in a step is not updated, so its count lags the step); every count
//      is an integer in [0, run.step]. Counts are per parameter, not per rank: any world size
//      loads them (resharding).
//   3  "manifest_crc32c", the last field: CRC32C of every byte of the file before its key
//      (seal_manifest). Any change to the file, a single byte anywhere, is refused; a version 1
//      or 2 manifest has none and still loads, with a note in the log.
//   4  "optimizer_state" per parameter: whether its files hold master, m and v. A frozen
//      parameter keeps its state (set_trainable), and a save writes it; versions 1 to 3 wrote
//      state for trainable parameters only, so a frozen one's kept moments are not there: a load
//      starts its state over (update count 0, m = v = 0) and says so in the log when its saved
//      count was above 0.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "zshard/checkpoint/crc32c.hpp"
#include "zshard/checkpoint/directory_handle.hpp"
#include "zshard/checkpoint/json_budget.hpp"
#include "zshard/checkpoint/safetensors_format.hpp"
#include "zshard/model/model_spec.hpp"
#include "zshard/partition/shard_layout.hpp"
#include "zshard/state/state_access.hpp"

namespace zshard::checkpoint {

inline constexpr const char* manifest_format = "zshard-checkpoint";
inline constexpr int manifest_version = 4;         // written
inline constexpr int manifest_oldest_version = 1;  // still read

struct manifest_param {
  std::string name;
  std::vector<std::int64_t> shape;
  dtype type = dtype::f32;  // working dtype at save time
  bool trainable = true, decay = true;
  std::uint64_t numel = 0, shard_numel = 0;
  bool replicated = false;
  bool optimizer_state = true;   // the files hold master, m, v (version 4; before: trainable ones only)
  bool file_transposed = false;  // exports write it as its transpose ("file_transposed": true; absent: false)

  // Its shape in an export: reversed when the files hold the transpose.
  std::vector<std::int64_t> file_shape() const {
    return file_transposed ? std::vector<std::int64_t>(shape.rbegin(), shape.rend()) : shape;
  }

  // The elements rank q's file holds: [first, second).
  std::pair<std::uint64_t, std::uint64_t> stored_range(int q) const noexcept {
    if (replicated)
      return q == 0 ? std::pair<std::uint64_t, std::uint64_t>{0, numel} : std::pair<std::uint64_t, std::uint64_t>{0, 0};
    const std::uint64_t b = std::min(numel, static_cast<std::uint64_t>(q) * shard_numel);
    return {b, std::min(numel, b + shard_numel)};
  }
};

struct manifest_file {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0;
};

inline std::string field_tensor(const std::string& param, state_field f) {
  return param + ":" + std::string(to_string(f));
}
inline std::string rank_file_name(int q) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", q);
  return buf;
}
inline constexpr const char* manifest_file_name = "manifest.json";
inline constexpr const char* user_state_file = "user_state.bin";

// The manifest's own checksum: the file ends with `"manifest_crc32c": N\n}\n`, N the CRC32C of
// every byte before the key. It covers the raw text, not a re-serialisation: a change of a
// digit, a key, the version, even of white space, is refused.
inline constexpr const char* manifest_checksum_key = "manifest_crc32c";

// `json_object` (the text of a JSON object) with the checksum added as its last field.
inline std::string seal_manifest(std::string json_object) {
  auto trim = [&] {
    while (!json_object.empty() && std::isspace(static_cast<unsigned char>(json_object.back()))) json_object.pop_back();
  };
  trim();
  ZSHARD_REQUIRE(json_object.size() >= 2 && json_object.front() == '{' && json_object.back() == '}', error_kind::usage,
                 "seal_manifest: the text is not a JSON object");
  json_object.pop_back();
  trim();
  const std::string body = json_object + (json_object.back() == '{' ? "\n " : ",\n ");
  return body + "\"" + manifest_checksum_key + "\": " + std::to_string(crc32c_of(body.data(), body.size())) + "\n}\n";
}

// Throws unless `text` (which parsed as `j`, holding the checksum key) is exactly what
// seal_manifest writes for its bytes before the key.
inline void check_manifest_seal(const std::string& text, const nlohmann::json& j, const std::string& path) {
  const std::string key = "\"" + std::string(manifest_checksum_key) + "\": ";
  const auto at = text.rfind(key);
  const std::string body = at == std::string::npos ? text : text.substr(0, at);
  const std::uint32_t got = crc32c_of(body.data(), body.size());
  if (at != std::string::npos && text == body + key + std::to_string(got) + "\n}\n") return;
  const nlohmann::json& stated = j.at(manifest_checksum_key);
  char buf[96];
  if (stated.is_number_unsigned() && stated.get<std::uint64_t>() != got && at != std::string::npos)
    std::snprintf(buf, sizeof buf, " (CRC32C %08x of its text, the manifest says %08llx)", got,
                  static_cast<unsigned long long>(stated.get<std::uint64_t>()));
  else
    std::snprintf(buf, sizeof buf, " (its \"%s\" field is not the last line zshard writes)", manifest_checksum_key);
  throw error(error_kind::io, "'" + path + "' fails its checksum" + std::string(buf) + ": the manifest is damaged",
              "restore manifest.json from a copy, or load an earlier checkpoint");
}

// The most rank files a manifest may list (the world size, or the shard group's under hybrid
// sharding, of the saving job): what bounds its "files" array.
inline constexpr std::uint64_t manifest_max_ranks = std::uint64_t{1} << 16;

// What a manifest may be, in bytes and in JSON values (json_budget.hpp), given the parameters
// the loading model has: refused beyond it before it is read (bytes) and before a DOM is built
// (values, depth). The format's deepest value is a parameter's shape (object, "params" array,
// parameter object, "shape" array: 4 levels); a parameter takes at most 32 values (its object,
// 10 keys, their values, 4 dimensions, its update count) and ~640 bytes plus its name as JSON
// escapes it (6 bytes a character at most), a rank file 8 values and ~160 bytes. Up to twice the
// model's parameters (plus 64) are allowed, so that a checkpoint of a somewhat different model
// still loads far enough to list every difference.
struct manifest_budget {
  std::uint64_t max_bytes = std::uint64_t{64} << 20;
  json_budget json{4, 0};

  static manifest_budget for_params(std::uint64_t params, std::uint64_t longest_name) {
    manifest_budget b;
    const std::uint64_t max_params = 2 * params + 64;
    b.max_bytes = 4096 + max_params * (640 + 6 * longest_name) + manifest_max_ranks * 160;
    b.json = {4, 64 + 32 * max_params + 8 * manifest_max_ranks};
    return b;
  }
  static manifest_budget for_model(const model_spec& spec) {
    std::uint64_t longest = 0;
    for (const auto& p : spec.params()) longest = std::max<std::uint64_t>(longest, p.name.size());
    return for_params(spec.params().size(), longest);
  }
  // No model to compare with (an export from a checkpoint on disk): up to 131,072 parameters
  // with names of any length, in at most 64 MiB.
  static manifest_budget any_model() {
    manifest_budget b = for_params(std::uint64_t{1} << 16, 0);
    b.max_bytes = std::uint64_t{64} << 20;
    return b;
  }
};

inline std::optional<dtype> parse_dtype(const std::string& s) {
  if (s == "f32") return dtype::f32;
  if (s == "bf16") return dtype::bf16;
  if (s == "f16") return dtype::f16;
  return std::nullopt;
}

struct manifest {
  int world_size = 1;
  run_state run{};
  std::vector<manifest_param> params;
  std::vector<manifest_file> files;  // index: the rank that wrote it
  std::optional<manifest_file> user_state;
  // params[i]'s AdamW update count (version 2); none in a version 1 manifest.
  std::optional<std::vector<std::int64_t>> update_counts;
  int version = manifest_version;
  bool checksummed = true;  // false: a version 1 or 2 manifest, which has no checksum of its own

  std::string to_json() const {
    nlohmann::ordered_json j;
    j["format"] = manifest_format;
    j["version"] = manifest_version;
    j["world_size"] = world_size;
    j["run"] = {{"step", run.step},
                {"lr", run.lr},
                {"loss_scale", run.scaler.scale},
                {"skipped_steps", run.scaler.skipped_steps},
                {"overflows_at_min_scale", run.scaler.overflows_at_min_scale},
                {"good_steps_in_row", run.scaler.good_steps_in_row}};
    auto& ps = j["params"] = nlohmann::ordered_json::array();
    for (const auto& p : params) {
      ps.push_back({{"name", p.name},
                    {"shape", p.shape},
                    {"dtype", std::string(to_string(p.type))},
                    {"trainable", p.trainable},
                    {"decay", p.decay},
                    {"numel", p.numel},
                    {"shard_numel", p.shard_numel},
                    {"replicated", p.replicated},
                    {"optimizer_state", p.optimizer_state}});
      if (p.file_transposed) ps.back()["file_transposed"] = true;  // only when set: older readers' manifests stay as they were
    }
    auto file_json = [](const manifest_file& f) {
      return nlohmann::ordered_json{{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}};
    };
    auto& fs = j["files"] = nlohmann::ordered_json::array();
    for (const auto& f : files) fs.push_back(file_json(f));
    if (user_state) j["user_state"] = file_json(*user_state);
    if (update_counts) j["update_counts"] = *update_counts;
    return seal_manifest(j.dump(1));
  }

  // "update_counts": one integer per parameter, each in [0, run.step] (a parameter is updated
  // at most once per step).
  template <class Bad>
  static std::vector<std::int64_t> parse_update_counts(const nlohmann::json& j, const manifest& m, Bad&& bad) {
    if (!j.contains("update_counts"))
      throw bad("format version " + std::to_string(m.version) + " without \"update_counts\"");
    const auto& a = j.at("update_counts");
    if (!a.is_array()) throw bad("\"update_counts\" is not an array");
    if (a.size() != m.params.size())
      throw bad("\"update_counts\" has " + std::to_string(a.size()) + " entries for " +
                std::to_string(m.params.size()) + " parameters");
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string who = "update count of parameter '" + m.params[i].name + "'";
      if (!a[i].is_number_integer()) throw bad(who + " is not an integer: " + a[i].dump());
      const auto c = a[i].is_number_unsigned() &&
                             a[i].get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max())
                         ? std::int64_t{-1}
                         : a[i].get<std::int64_t>();
      if (c < 0 || c > m.run.step)
        throw bad(who + " is " + a[i].dump() + ", outside [0, " + std::to_string(m.run.step) + "] (the run's step)");
      out.push_back(c);
    }
    return out;
  }

  static error invalid(const std::string& path, const std::string& what) {
    return error(error_kind::io, "'" + path + "' is not a valid zshard checkpoint manifest: " + what,
                 "the checkpoint is damaged or was not written by zshard; load an earlier one");
  }
  static std::string too_large(std::uint64_t bytes, const manifest_budget& budget) {
    return "it has " + std::to_string(bytes) + " bytes, more than the " + std::to_string(budget.max_bytes) +
           " a manifest of this model can have";
  }

  // manifest.json of checkpoint directory `dir` (checkpoint_dir.hpp: open_checkpoint), refused
  // beyond `budget` before it is read.
  static manifest read(const directory_handle& dir, const manifest_budget& budget, const io_hook* hook = nullptr) {
    const file_handle f = dir.open_file(manifest_file_name, hook);
    if (f.size() > budget.max_bytes) throw invalid(f.path(), too_large(f.size(), budget));
    return parse(read_whole(f, static_cast<std::size_t>(budget.max_bytes)), f.path(), budget);
  }

  // Parses and checks every field's presence and type; `path` names the file in errors. Text
  // beyond `budget` is refused before it is parsed into anything.
  static manifest parse(const std::string& text, const std::string& path,
                        const manifest_budget& budget = manifest_budget::any_model()) {
    using nlohmann::json;
    auto bad = [&](const std::string& what) -> error { return invalid(path, what); };
    if (text.size() > budget.max_bytes) throw bad(too_large(text.size(), budget));
    if (const auto excess = json_within(text, budget.json)) throw bad(excess.describe(budget.json));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
    const bool sealed = j.contains(manifest_checksum_key);
    if (sealed) check_manifest_seal(text, j, path);  // before anything of it is believed
    try {
      if (j.at("format").get<std::string>() != manifest_format)
        throw bad("format is not " + std::string(manifest_format));
      const int version = j.at("version").get<int>();
      if (version < manifest_oldest_version || version > manifest_version)
        throw error(error_kind::io,
                    "'" + path + "' has checkpoint format version " + std::to_string(version) + ", this zshard reads " +
                        std::to_string(manifest_oldest_version) + " to " + std::to_string(manifest_version),
                    "load it with the zshard version that wrote it and export it, or retrain");
      if (version >= 3 && !sealed)
        throw bad("format version " + std::to_string(version) + " without \"" + manifest_checksum_key + "\"");
      manifest m;
      m.version = version;
      m.checksummed = sealed;
      m.world_size = j.at("world_size").get<int>();
      if (m.world_size < 1) throw bad("world_size < 1");
      const json& r = j.at("run");
      m.run.step = r.at("step").get<std::int64_t>();
      m.run.lr = r.at("lr").get<float>();
      m.run.scaler.scale = r.at("loss_scale").get<float>();
      m.run.scaler.skipped_steps = r.at("skipped_steps").get<std::int64_t>();
      m.run.scaler.overflows_at_min_scale = r.at("overflows_at_min_scale").get<std::int64_t>();
      m.run.scaler.good_steps_in_row = r.at("good_steps_in_row").get<std::int64_t>();
      for (const json& p : j.at("params")) {
        manifest_param mp;
        mp.name = p.at("name").get<std::string>();
        mp.shape = p.at("shape").get<std::vector<std::int64_t>>();
        const auto t = parse_dtype(p.at("dtype").get<std::string>());
        if (!t) throw bad("parameter '" + mp.name + "' has an unknown dtype");
        mp.type = *t;
        mp.trainable = p.at("trainable").get<bool>();
        mp.decay = p.at("decay").get<bool>();
        mp.numel = p.at("numel").get<std::uint64_t>();
        mp.shard_numel = p.at("shard_numel").get<std::uint64_t>();
        mp.replicated = p.at("replicated").get<bool>();
        if (version >= 4 && !p.contains("optimizer_state"))
          throw bad("format version " + std::to_string(version) + " without \"optimizer_state\" for parameter '" +
                    mp.name + "'");
        mp.optimizer_state = version >= 4 ? p.at("optimizer_state").get<bool>() : mp.trainable;
        if (mp.trainable && !mp.optimizer_state) throw bad("trainable parameter '" + mp.name + "' without optimizer state");
        mp.file_transposed = p.contains("file_transposed") && p.at("file_transposed").get<bool>();
        if (mp.file_transposed && mp.shape.size() != 2) throw bad("parameter '" + mp.name + "' is file_transposed but not 2-D");
        std::uint64_t n = 1;
        for (auto d : mp.shape) n *= static_cast<std::uint64_t>(d < 0 ? 0 : d);
        if (n != mp.numel || (!mp.replicated && mp.shard_numel * std::uint64_t(m.world_size) < mp.numel))
          throw bad("parameter '" + mp.name + "' has an inconsistent shape or layout");
        m.params.push_back(std::move(mp));
      }
      auto file_of = [](const json& f) {
        return manifest_file{f.at("name").get<std::string>(), f.at("bytes").get<std::uint64_t>(),
                             f.at("crc32c").get<std::uint32_t>()};
      };
      for (const json& f : j.at("files")) m.files.push_back(file_of(f));
      if (m.files.size() != static_cast<std::size_t>(m.world_size))
        throw bad(std::to_string(m.files.size()) + " rank files listed for world size " + std::to_string(m.world_size));
      for (int q = 0; q < m.world_size; ++q)
        if (m.files[static_cast<std::size_t>(q)].name != rank_file_name(q)) throw bad("rank file names out of order");
      if (j.contains("user_state")) {
        m.user_state = file_of(j.at("user_state"));
        if (m.user_state->name != user_state_file)  // the one name a save writes: nothing outside the directory
          throw bad("the user state is named '" + m.user_state->name + "', not '" + user_state_file +
                    "' (the only name a save writes)");
      }
      if (version >= 2) m.update_counts = parse_update_counts(j, m, bad);
      return m;
    } catch (const json::exception& e) {
      throw bad(e.what());
    }
  }
};

// Every way the checkpoint's model differs from `spec` (with working dtype default
// `param_dtype`), one line each; empty when they match.
inline std::vector<std::string> compare_models(const manifest& m, const model_spec& spec, dtype param_dtype) {
  std::vector<std::string> out;
  std::vector<bool> matched(m.params.size(), false);
  for (const auto& p : spec.params()) {
    auto it = std::find_if(m.params.begin(), m.params.end(), [&](const manifest_param& q) { return q.name == p.name; });
    if (it == m.params.end()) {
      out.push_back("missing from the checkpoint: '" + p.name + "' " + p.shape.to_string());
      continue;
    }
    matched[static_cast<std::size_t>(it - m.params.begin())] = true;
    std::vector<std::int64_t> dims;
    for (int i = 0; i < p.shape.rank(); ++i) dims.push_back(p.shape[i]);
    if (dims != it->shape) {
      std::string s = "[";
      for (std::size_t i = 0; i < it->shape.size(); ++i) s += (i ? ", " : "") + std::to_string(it->shape[i]);
      out.push_back("shape of '" + p.name + "': model " + p.shape.to_string() + ", checkpoint " + s + "]");
    }
    if (p.trainable != it->trainable)
      out.push_back("'" + p.name + "' is " + (p.trainable ? "trainable" : "frozen") + " in the model, " +
                    (it->trainable ? "trainable" : "frozen") + " in the checkpoint");
    if (p.decay != it->decay)
      out.push_back("'" + p.name + "' has weight decay " + (p.decay ? "on" : "off") + " in the model, " +
                    (it->decay ? "on" : "off") + " in the checkpoint (manifest \"decay\")");
    (void)param_dtype;  // a different working dtype is converted on load
  }
  for (std::size_t i = 0; i < m.params.size(); ++i)
    if (!matched[i]) out.push_back("unexpected in the checkpoint: '" + m.params[i].name + "'");
  return out;
}

}  // namespace zshard::checkpoint

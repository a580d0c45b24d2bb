#pragma once
// load_pretrained(engine, path): pretrained weights from safetensors files as Hugging Face
// writes them (one file, or a *.safetensors.index.json and its files) into an engine,
// collective. Each rank reads only the byte ranges of its own shards (pread), through one
// chunk of pretrained_options::chunk_bytes counted in a ledger (host_staging.hpp), so host
// memory stays bounded however large the model is.
//
// A name map connects the files' names to the model_spec's: a rename table, or a function
// (which wins); unmapped names are taken as they are. Before anything is written, every
// parameter is matched: all missing, unexpected (unless allowed) and mismatched tensors
// (shape, or a dtype other than F32/BF16/F16) are reported in one error, on every rank.
// Values are converted to the parameter's dtype and to the f32 master (bf16/f16 -> f32 is
// exact; f32 -> bf16/f16 rounds to nearest even). Optimizer moments and counters are left as
// they are (zero in a fresh engine).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/host_staging.hpp"
#include "zshard/checkpoint/safetensors_reader.hpp"
#include "zshard/checkpoint/sharded_load.hpp"

namespace zshard::checkpoint {

struct pretrained_options {
  std::map<std::string, std::string> rename;                 // model name -> name in the files
  std::function<std::string(const std::string&)> name_map;   // model name -> name in the files (wins over rename)
  bool allow_unexpected = false;                             // tensors in the files no parameter maps to
  std::size_t chunk_bytes = std::size_t{64} << 20;           // host memory each rank moves data through
};

struct pretrained_report {
  std::size_t loaded = 0;               // parameters written
  std::vector<std::string> unexpected;  // file tensors no parameter mapped to (allow_unexpected)
};

inline std::string file_name_for(const pretrained_options& o, const std::string& model_name) {
  if (o.name_map) return o.name_map(model_name);
  auto it = o.rename.find(model_name);
  return it == o.rename.end() ? model_name : it->second;
}

template <class Engine>
pretrained_report load_pretrained(Engine& eng, const std::string& path, const pretrained_options& o = {}) {
  const std::string what = "loading pretrained weights from '" + path + "'";
  std::unique_ptr<safetensors_source> src;
  std::vector<safetensors_source::located> at(eng.spec().params().size());
  std::unique_ptr<host_staging<typename Engine::backend_type>> chunk;
  pretrained_report rep;

  agree(eng, what, [&] {
    src = std::make_unique<safetensors_source>(path);
    std::vector<std::string> missing, mismatched;
    std::map<std::string, bool> used;
    for (param_id p = 0; p < at.size(); ++p) {
      const auto& ps = eng.spec().params()[p];
      const std::string fname = file_name_for(o, ps.name);
      at[p] = src->find(fname);
      const tensor_entry* t = at[p].tensor;
      const std::string label = "'" + ps.name + "'" + (fname != ps.name ? " (file name '" + fname + "')" : "");
      if (!t) {
        missing.push_back(label + " " + ps.shape.to_string());
        continue;
      }
      used[fname] = true;
      std::vector<std::int64_t> dims;
      for (int i = 0; i < ps.shape.rank(); ++i) dims.push_back(ps.shape[i]);
      std::string fs = "[";
      for (std::size_t i = 0; i < t->shape.size(); ++i) fs += (i ? ", " : "") + std::to_string(t->shape[i]);
      fs += "]";
      if (dims != t->shape) mismatched.push_back(label + ": model " + ps.shape.to_string() + ", file " + fs);
      if (!param_dtype_of(t->type)) mismatched.push_back(label + ": dtype " + safetensors_name(t->type) + " is not F32/BF16/F16");
    }
    for (const auto& l : src->tensors())
      if (!used.count(l.tensor->name)) rep.unexpected.push_back(l.tensor->name);
    const bool bad_unexpected = !o.allow_unexpected && !rep.unexpected.empty();
    if (!missing.empty() || !mismatched.empty() || bad_unexpected) {
      std::string msg = "'" + path + "' does not match the model (" + eng.spec().label() + "):";
      for (const auto& s : missing) msg += "\n  missing: " + s;
      if (bad_unexpected)
        for (const auto& s : rep.unexpected) msg += "\n  unexpected: '" + s + "'";
      for (const auto& s : mismatched) msg += "\n  mismatched: " + s;
      throw error(error_kind::config, msg,
                  "map names with pretrained_options::rename or name_map, allow_unexpected for extra tensors, "
                  "or build the model the file holds");
    }
    // the chunk fits the budget (checked here, so every rank knows); allocated again below,
    // after the agreement's own small buffers are gone, so the peak is the chunk alone
    host_staging<typename Engine::backend_type> probe(eng.backend(), o.chunk_bytes);
  });
  chunk = std::make_unique<host_staging<typename Engine::backend_type>>(eng.backend(), o.chunk_bytes);

  try {
    for (param_id p = 0; p < at.size(); ++p) {
      const tensor_entry& t = *at[p].tensor;
      const safetensors_file& f = *at[p].file;
      const auto [b, e] = held_range(eng, p);
      const dtype from = *param_dtype_of(t.type), work = eng.store()[p].type;
      const bool trainable = eng.spec().params()[p].trainable;
      // chunk: file elements | f32 | working
      const std::size_t per = size_of(from) + 4 + size_of(work);
      const std::size_t k_max = chunk->bytes() / per / 16 * 16;  // keeps the f32 part aligned
      ZSHARD_REQUIRE(k_max > 0, error_kind::config, "pretrained_options::chunk_bytes is too small");
      char* raw = chunk->bytes_at(0);
      auto* f32 = reinterpret_cast<float*>(chunk->bytes_at(k_max * size_of(from)));
      char* working = chunk->bytes_at(k_max * (size_of(from) + 4));
      for (std::uint64_t g = b; g < e;) {
        const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(k_max, e - g));
        f.read(t, g, k, raw);
        convert(raw, from, f32, dtype::f32, k);
        if (trainable) eng.write_shard(p, state_field::master, g - b, f32, k);
        convert(f32, dtype::f32, working, work, k);
        eng.write_shard(p, state_field::working, g - b, working, k);
        g += k;
      }
      ++rep.loaded;
    }
  } catch (const error& e) {
    throw error(e.kind(), what + ": failed after validation, the engine is partly loaded: " + e.message(),
                "load again, or rebuild the engine");
  }
  return rep;
}

}  // namespace zshard::checkpoint

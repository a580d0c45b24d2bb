#pragma once
// load_pretrained(engine, path): pretrained weights from safetensors files as Hugging Face
// writes them (one file, or a *.safetensors.index.json and its files) into an engine,
// collective. Each rank reads only the byte ranges of its own shards (pread), through one
// chunk of at most pretrained_options::chunk_bytes counted in a ledger (host_staging.hpp), so host
// memory stays bounded however large the model is.
//
// A name map connects the files' names to the model_spec's: a rename table, or a function
// (which wins); unmapped names are taken as they are. Before anything is written, every
// parameter is matched: all missing, unexpected (unless allowed) and mismatched tensors
// (shape, or a dtype other than F32/BF16/F16) are reported in one error, on every rank.
// Values are converted to the parameter's dtype and to the f32 master (bf16/f16 -> f32 is
// exact; f32 -> bf16/f16 rounds to nearest even). Optimizer moments and counters are left as
// they are (zero in a fresh engine). A parameter registered with param_options::file_transposed
// is read as the transpose of the file's tensor (shape reversed: torch's (out, in) for a weight
// the model keeps as (in, out)), the layout export_engine writes. A file that records its layout
// (file_layout.hpp: zshard's exports list the tensors they hold transposed) must agree with every
// parameter's registration: a square weight would otherwise load transposed without a word; a
// file without the record (written by other tools) is read as the model's registration says.
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/chunked_copy.hpp"
#include "zshard/checkpoint/file_layout.hpp"
#include "zshard/checkpoint/host_staging.hpp"
#include "zshard/checkpoint/safetensors_reader.hpp"
#include "zshard/checkpoint/sharded_load.hpp"
#include "zshard/checkpoint/transposed_copy.hpp"

namespace zshard::checkpoint {

struct pretrained_options {
  std::map<std::string, std::string> rename{};                // model name -> name in the files
  std::function<std::string(const std::string&)> name_map{};  // model name -> name in the files (wins over rename)
  bool allow_unexpected = false;                             // tensors in the files no parameter maps to
  // File tensors no parameter maps to that are skipped without a word (e.g. the rotary_emb.inv_freq
  // buffers of older Llama checkpoints); the others are errors unless allow_unexpected.
  std::function<bool(const std::string&)> ignorable{};
  std::size_t chunk_bytes = std::size_t{64} << 20;           // host memory each rank moves data through
  // A file that records its layout (metadata "zshard_transposed": zshard's exports) must agree
  // with each parameter's param_options::file_transposed; false: the model's registration alone
  // decides (for a model that keeps a weight in the other layout on purpose).
  bool check_file_layout = true;
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

// This rank's elements [b, e) of a (rows, cols) parameter from a file holding its transpose.
// Chunk: the file's elements | the same transposed | f32 | working.
template <class Engine, class Staging>
void load_transposed(Engine& eng, param_id p, const safetensors_file& f, const tensor_entry& t, std::uint64_t b,
                     std::uint64_t e, Staging& chunk, bool trainable) {
  const auto& shape = eng.spec().params()[p].shape;
  const auto rows = static_cast<std::uint64_t>(shape[0]), cols = static_cast<std::uint64_t>(shape[1]);
  const dtype from = *param_dtype_of(t.type), work = eng.store()[p].type;
  const std::size_t per = 2 * size_of(from) + 4 + size_of(work);
  const std::uint64_t k_max = chunk.bytes() / per / 16 * 16;
  ZSHARD_REQUIRE(k_max > 0, error_kind::config, "pretrained_options::chunk_bytes is too small");
  char* raw = chunk.bytes_at(0);
  char* flipped = chunk.bytes_at(k_max * size_of(from));
  auto* f32 = reinterpret_cast<float*>(chunk.bytes_at(2 * k_max * size_of(from)));
  char* working = chunk.bytes_at(k_max * (2 * size_of(from) + 4));
  for_each_block(cols, b, e, k_max, [&](const matrix_block& k) {
    for (std::uint64_t c = 0; c < k.cols(); ++c)  // the file's row j0 + c: column j0 + c of the parameter
      f.read(t, (k.j0 + c) * rows + k.i0, k.rows(), raw + c * k.rows() * size_of(from));
    transpose_bytes(raw, flipped, k.cols(), k.rows(), size_of(from));
    convert(flipped, from, f32, dtype::f32, k.rows() * k.cols());
    convert(f32, dtype::f32, working, work, k.rows() * k.cols());
    for (std::uint64_t r = 0; r < k.rows(); ++r) {
      const std::uint64_t at = (k.i0 + r) * cols + k.j0 - b;
      if (trainable) eng.write_shard(p, state_field::master, at, f32 + r * k.cols(), k.cols());
      eng.write_shard(p, state_field::working, at, working + r * k.cols() * size_of(work), k.cols());
    }
  });
}

template <class Engine>
pretrained_report load_pretrained(Engine& eng, const std::string& path, const pretrained_options& o = {}) {
  const std::string what = "loading pretrained weights from '" + path + "'";
  std::unique_ptr<safetensors_source> src;
  std::vector<safetensors_source::located> at(eng.spec().params().size());
  std::unique_ptr<host_staging<typename Engine::backend_type>> chunk;
  std::size_t chunk_bytes = o.chunk_bytes;
  pretrained_report rep;

  agree(eng, what, [&] {
    src = std::make_unique<safetensors_source>(path);
    std::vector<std::string> missing, mismatched;
    std::map<std::string, bool> used;
    // each file's recorded layout (file_layout.hpp), when it records one
    std::map<const safetensors_file*, std::optional<std::set<std::string>>> layouts;
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
      if (ps.file_transposed) std::reverse(dims.begin(), dims.end());
      const auto show = [](const std::vector<std::int64_t>& d) {
        std::string out = "[";
        for (std::size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
        return out + "]";
      };
      if (dims != t->shape)
        mismatched.push_back(label + ": model " + ps.shape.to_string() +
                             (ps.file_transposed ? ", held transposed, so the file should hold " + show(dims) : "") +
                             ", file " + show(t->shape));
      if (!param_dtype_of(t->type)) mismatched.push_back(label + ": dtype " + safetensors_name(t->type) + " is not F32/BF16/F16");
      if (!o.check_file_layout) continue;
      auto [layout, fresh] = layouts.try_emplace(at[p].file);
      if (fresh) layout->second = transposed_tensors(at[p].file->header().metadata, at[p].file->path());
      if (!layout->second || layout->second->count(t->name) == std::size_t(ps.file_transposed)) continue;
      mismatched.push_back(
          label + (ps.file_transposed
                       ? ": the file holds it as the model that wrote it registered it (its metadata \"" +
                             std::string(transposed_metadata_key) +
                             "\" does not list it), this model registers it with file_transposed"
                       : ": the file holds its transpose (its metadata \"" + std::string(transposed_metadata_key) +
                             "\" lists it: the model that wrote it registered it with file_transposed), this model "
                             "registers it without") +
          ": it would load transposed");
    }
    for (const auto& l : src->tensors())
      if (!used.count(l.tensor->name) && !(o.ignorable && o.ignorable(l.tensor->name)))
        rep.unexpected.push_back(l.tensor->name);
    const bool bad_unexpected = !o.allow_unexpected && !rep.unexpected.empty();
    if (!missing.empty() || !mismatched.empty() || bad_unexpected) {
      std::string msg = "'" + path + "' does not match the model (" + eng.spec().label() + "):";
      for (const auto& s : missing) msg += "\n  missing: " + s;
      if (bad_unexpected)
        for (const auto& s : rep.unexpected) msg += "\n  unexpected: '" + s + "'";
      for (const auto& s : mismatched) msg += "\n  mismatched: " + s;
      throw error(error_kind::config, msg,
                  "map names with pretrained_options::rename or name_map, allow_unexpected for extra tensors, "
                  "or build the model the file holds (register a weight with file_transposed as the model that "
                  "wrote the file did; pretrained_options::check_file_layout = false if this model keeps it in the "
                  "other layout on purpose)");
    }
    // the chunk, no larger than this rank's largest piece needs (a small model is not charged
    // the whole chunk_bytes; a transposed piece holds the file's elements twice)
    std::uint64_t needed = 0;
    for (param_id p = 0; p < at.size(); ++p) {
      const auto [b, e] = held_range(eng, p);
      const std::uint64_t per = (eng.spec().params()[p].file_transposed ? 2 : 1) * size_of(*param_dtype_of(at[p].tensor->type)) +
                                4 + size_of(eng.store()[p].type);
      needed = std::max(needed, chunk_bytes_for_arrays(e - b, per));
    }
    if (needed > 0 && needed < chunk_bytes) chunk_bytes = static_cast<std::size_t>(needed);
    // the chunk fits the budget (checked here, so every rank knows); allocated again below,
    // after the agreement's own small buffers are gone, so the peak is the chunk alone
    host_staging<typename Engine::backend_type> probe(eng.backend(), chunk_bytes);
  });
  chunk = std::make_unique<host_staging<typename Engine::backend_type>>(eng.backend(), chunk_bytes);

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
      if (eng.spec().params()[p].file_transposed) {
        load_transposed(eng, p, f, t, b, e, *chunk, trainable);
        ++rep.loaded;
        continue;
      }
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

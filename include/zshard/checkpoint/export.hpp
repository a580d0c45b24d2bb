#pragma once
// Export: the model as one safetensors file (spec names, bf16 or f32, 1 tensor per parameter
// with its shape), from a running engine or from a sharded checkpoint on disk. A parameter
// registered with param_options::file_transposed (a linear weight kept as (in, out)) is written
// as its transpose, torch's (out, in), with the shape reversed (transposed_copy.hpp), and the
// file's metadata "zshard_transposed" lists every such tensor (file_layout.hpp), so that a
// loading model registered otherwise is refused instead of loading a square weight transposed.
//
// From an engine (export_engine, collective): rank 0 writes the header and sizes the file;
// then every rank writes the elements it owns straight to their offsets (pwrite), through one
// chunk — no gathers, no rank holds more than its shards and the chunk. Ranks meet through
// marker files (rank_writes.hpp), so a slow disk does not trip the communicator's timeout; rank
// 0 then fsyncs and renames the file into place. The file appears complete or not at all.
//
// From a checkpoint (export_checkpoint, one process, no engine: tools/zshard_export): tensor
// by tensor in file order, each assembled from the rank files that hold its pieces, through
// one chunk; every rank file's checksum is verified first.
#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/checkpoint_dir.hpp"
#include "zshard/checkpoint/chunked_copy.hpp"
#include "zshard/checkpoint/file_layout.hpp"
#include "zshard/checkpoint/host_staging.hpp"
#include "zshard/checkpoint/manifest.hpp"
#include "zshard/checkpoint/rank_writes.hpp"
#include "zshard/checkpoint/safetensors_reader.hpp"
#include "zshard/checkpoint/safetensors_writer.hpp"
#include "zshard/checkpoint/sharded_load.hpp"
#include "zshard/checkpoint/transposed_copy.hpp"
#include "zshard/checkpoint/verified_reads.hpp"

namespace zshard::checkpoint {

struct export_options {
  dtype type = dtype::f32;  // f32 or bf16 (f16 works too)
  // working: the values the model computes with; master: the f32 master of trainable
  // parameters (frozen ones have only working values)
  state_field source = state_field::working;
  std::size_t chunk_bytes = std::size_t{64} << 20;
  std::chrono::milliseconds io_timeout = std::chrono::minutes(30);
  io_hook hook{};  // tests: sees every file-system call of the export (io_hook.hpp)
};

inline std::vector<planned_tensor> export_plan(const std::vector<manifest_param>& params, dtype type) {
  std::vector<planned_tensor> plan;
  for (const auto& p : params) plan.push_back({p.name, file_dtype_of(type), p.file_shape()});
  return plan;
}

// An export's "__metadata__": torch's "format" and, when `record_layout`, the layout it records
// (file_layout.hpp): the tensors it holds as the transpose of the model's parameter, by their
// names in the file.
inline std::map<std::string, std::string> export_metadata(const std::vector<std::string>& transposed,
                                                          bool record_layout = true) {
  if (!record_layout) return {{"format", "pt"}};
  return {{"format", "pt"}, {transposed_metadata_key, transposed_metadata(transposed)}};
}
inline std::map<std::string, std::string> export_metadata(const std::vector<manifest_param>& params) {
  std::vector<std::string> transposed;
  for (const auto& p : params)
    if (p.file_transposed) transposed.push_back(p.name);
  return export_metadata(transposed);
}

namespace detail {
// The chunk of a transposed copy: read | converted | transposed, each of k_max elements.
inline std::uint64_t transposed_chunk_numel(std::size_t chunk_bytes, dtype from, dtype to) {
  const std::uint64_t k = chunk_bytes / (size_of(from) + 2 * size_of(to)) / 16 * 16;
  ZSHARD_REQUIRE(k > 0, error_kind::config, "export chunk of " + std::to_string(chunk_bytes) + " bytes is too small",
                 "use a chunk of at least a few KiB (e.g. 64 MiB)");
  return k;
}
// The chunk bytes that move n elements in one transposed piece (more is never used).
constexpr std::uint64_t transposed_chunk_bytes_for(std::uint64_t n, dtype from, dtype to) noexcept {
  return chunk_bytes_for_arrays(n, size_of(from) + 2 * size_of(to));
}

// Elements [b, e) of a (rows, cols) parameter into a file that holds its transpose.
// read(flat, k, dst): k `from` elements from row-major index `flat`; write(at, k, src): k `to`
// elements at the file tensor's element index `at`.
template <class Read, class Write>
void copy_to_transposed(char* chunk, std::size_t chunk_bytes, std::uint64_t rows, std::uint64_t cols, std::uint64_t b,
                        std::uint64_t e, dtype from, dtype to, Read&& read, Write&& write) {
  const std::uint64_t k_max = transposed_chunk_numel(chunk_bytes, from, to);
  char* converted = chunk + k_max * size_of(from);
  char* flipped = converted + k_max * size_of(to);
  for_each_block(cols, b, e, k_max, [&](const matrix_block& k) {
    for (std::uint64_t r = 0; r < k.rows(); ++r)
      read((k.i0 + r) * cols + k.j0, k.cols(), chunk + r * k.cols() * size_of(from));
    convert(chunk, from, converted, to, k.rows() * k.cols());
    transpose_bytes(converted, flipped, k.rows(), k.cols(), size_of(to));
    for (std::uint64_t c = 0; c < k.cols(); ++c)
      write((k.j0 + c) * rows + k.i0, k.rows(), flipped + c * k.rows() * size_of(to));
  });
}

// The whole transposed tensor in file order (a sequential writer): write(src, k).
template <class Read, class Write>
void copy_transposed_in_file_order(char* chunk, std::size_t chunk_bytes, std::uint64_t rows, std::uint64_t cols,
                                   dtype from, dtype to, Read&& read, Write&& write) {
  const std::uint64_t k_max = transposed_chunk_numel(chunk_bytes, from, to);
  char* converted = chunk + k_max * size_of(from);
  char* flipped = converted + k_max * size_of(to);
  // blocks of the file's (cols, rows) matrix: its rows are the parameter's columns
  for_each_block(rows, 0, rows * cols, k_max, [&](const matrix_block& k) {
    for (std::uint64_t s = 0; s < k.cols(); ++s)  // the parameter's row k.j0 + s, columns [k.i0, k.i1)
      read((k.j0 + s) * cols + k.i0, k.rows(), chunk + s * k.rows() * size_of(from));
    convert(chunk, from, converted, to, k.rows() * k.cols());
    transpose_bytes(converted, flipped, k.cols(), k.rows(), size_of(to));
    write(flipped, k.rows() * k.cols());
  });
}
}  // namespace detail

inline void check_export_options(const export_options& o) {
  ZSHARD_REQUIRE(o.source == state_field::working || o.source == state_field::master, error_kind::usage,
                 "export_options::source must be working or master");
}

namespace detail {
// One file an export writes: the parameters it holds, in file order, under their names there.
struct export_file {
  std::string path;
  std::vector<param_id> params;
  std::vector<std::string> names;
};

// The collective body of an engine export into `files` (each inside the temporary directory
// `tmp`): rank 0 runs prepare(), creates every file with its header at its full size and the
// markers; every rank writes the elements it owns of each parameter straight to their offsets
// (pwrite) through one chunk; the ranks meet through the markers; rank 0 runs commit() (which
// moves the files into place). `tmp` is removed afterwards, and on failure with all it held.
// record_layout: each file's metadata lists its transposed tensors (file_layout.hpp); false
// writes torch's {"format": "pt"} alone (export_hf: the files transformers writes, byte for byte).
template <class Engine, class Prepare, class Commit>
void export_files(Engine& eng, const manifest& m, const std::string& tmp, const std::vector<export_file>& files,
                  const export_options& o, const std::string& what, Prepare&& prepare, Commit&& commit,
                  bool record_layout = true) {
  // Ranks meet over the whole job; under hybrid sharding only replica 0's shard group writes.
  const int rank = job_comm(eng).rank(), world = job_comm(eng).size();
  const int shard_rank = eng.comm().rank();
  const bool writes = replica_of(eng) == 0;
  const io_hook* hook = o.hook ? &o.hook : nullptr;
  const std::string markers = tmp + "/markers";
  std::vector<std::string> headers;
  std::vector<std::uint64_t> file_bytes;
  std::vector<std::size_t> file_of(m.params.size(), files.size());
  std::vector<std::uint64_t> start(m.params.size(), 0);  // a parameter's data offset in its file
  for (std::size_t f = 0; f < files.size(); ++f) {
    std::vector<planned_tensor> plan;
    for (std::size_t i = 0; i < files[f].params.size(); ++i)
      plan.push_back({files[f].names[i], file_dtype_of(o.type), m.params[files[f].params[i]].file_shape()});
    std::vector<std::uint64_t> offsets;
    std::vector<std::string> transposed;  // under their names in the file
    for (std::size_t i = 0; i < files[f].params.size(); ++i)
      if (m.params[files[f].params[i]].file_transposed) transposed.push_back(files[f].names[i]);
    headers.push_back(make_header(plan, export_metadata(transposed, record_layout), &offsets));
    std::uint64_t end = headers.back().size();
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const param_id p = files[f].params[i];
      file_of[p] = f;
      start[p] = headers.back().size() + offsets[i];
      end += plan[i].bytes();
    }
    file_bytes.push_back(end);
  }
  try {
    agree(eng, what, [&] {
      if (rank != 0) return;
      prepare();
      remove_tree(tmp, hook);
      make_directories(markers, hook);
      prepare_markers(markers, world, hook);
      for (std::size_t f = 0; f < files.size(); ++f) {
        make_directories(std::filesystem::path(files[f].path).parent_path().string(), hook);
        file_handle h = file_handle::create(files[f].path, hook);
        h.write_all(headers[f].data(), headers[f].size());
        h.truncate(file_bytes[f]);
        h.close();
      }
    });
    write_and_meet(
        eng, markers, o.io_timeout, what,
        [&] {
          // The elements this rank writes, and their source field; the chunk is sized for the
          // largest piece (a transposed one holds three arrays of it, the others two).
          struct piece {
            std::uint64_t b, e;
            state_field fld;
            dtype from;
          };
          std::vector<piece> pieces;
          std::uint64_t chunk_needed = 0;
          for (param_id p = 0; writes && p < m.params.size(); ++p) {
            const auto& mp = m.params[p];
            const auto [b, e] = file_of[p] == files.size() ? std::pair<std::uint64_t, std::uint64_t>{0, 0}
                                : mp.replicated ? (shard_rank == 0 ? std::pair<std::uint64_t, std::uint64_t>{0, mp.numel}
                                                                   : std::pair<std::uint64_t, std::uint64_t>{0, 0})
                                                : held_range(eng, p);
            const state_field fld = mp.trainable ? o.source : state_field::working;
            pieces.push_back({b, e, fld, fld == state_field::working ? mp.type : dtype::f32});
            const dtype from = pieces.back().from;
            chunk_needed = std::max(chunk_needed, mp.file_transposed ? transposed_chunk_bytes_for(e - b, from, o.type)
                                                                     : chunk_bytes_for(e - b, from, o.type));
          }
          lazy_host_staging<typename Engine::backend_type> chunk(eng.backend(), o.chunk_bytes);
          chunk.fit(chunk_needed);
          std::vector<file_handle> out(files.size());  // opened at this rank's first piece in each
          for (param_id p = 0; p < pieces.size(); ++p) {
            const auto& mp = m.params[p];
            const auto [b, e, fld, from] = pieces[p];
            if (e == b) continue;
            file_handle& f = out[file_of[p]];
            if (!f) f = file_handle(files[file_of[p]].path, O_WRONLY, 0644, hook);
            if (mp.file_transposed) {
              copy_to_transposed(
                  static_cast<char*>(chunk.data()), chunk.bytes(), std::uint64_t(mp.shape[0]), std::uint64_t(mp.shape[1]),
                  b, e, from, o.type,
                  [&](std::uint64_t g, std::size_t k, void* dst) { eng.read_shard(p, fld, g - b, dst, k); },
                  [&](std::uint64_t at, std::size_t k, const void* src) {
                    f.write_at(start[p] + at * size_of(o.type), src, k * size_of(o.type));
                  });
              continue;
            }
            const std::uint64_t base = start[p] + b * size_of(o.type);
            chunked_copy(
                static_cast<char*>(chunk.data()), chunk.bytes(), e - b, from, o.type,
                [&](std::uint64_t first, std::size_t k, void* dst) { eng.read_shard(p, fld, first, dst, k); },
                [&](std::uint64_t first, std::size_t k, const void* src) {
                  f.write_at(base + first * size_of(o.type), src, k * size_of(o.type));
                });
          }
          for (auto& f : out)
            if (f) {
              f.sync();
              f.close();
            }
          return std::string("ok");
        },
        [] {}, hook);
    agree(eng, what, [&] {
      if (rank == 0) commit();
    });
  } catch (...) {
    // Every rank fails at the same point (agree and write_and_meet fail on all alike): once all
    // are past the markers, rank 0 removes what the export wrote, so nothing is left behind
    // (unless the communicator failed too: then a peer may still be reading the markers).
    const std::exception_ptr failure = std::current_exception();
    bool all_past = false;
    try {
      agree(eng, what, [] {});
      all_past = true;
    } catch (...) {
    }
    if (all_past && rank == 0) try {
        remove_tree(tmp, hook);
      } catch (const error&) {  // leftovers: the next export to `out` removes them
      }
    std::rethrow_exception(failure);
  }
  if (rank == 0) try {  // every rank is past reading the markers
      remove_tree(tmp, hook);
    } catch (const error&) {  // leftovers: the next export to `out` removes them
    }
}
}  // namespace detail

template <class Engine>
void export_engine(Engine& eng, const std::string& out, const export_options& o = {}) {
  check_export_options(o);
  const io_hook* hook = o.hook ? &o.hook : nullptr;
  const manifest m = describe_engine(eng);
  const std::string tmp = out + ".zshard-export.tmp", data = tmp + "/data.safetensors";
  detail::export_file file{data, {}, {}};
  for (param_id p = 0; p < m.params.size(); ++p) {
    file.params.push_back(p);
    file.names.push_back(m.params[p].name);
  }
  detail::export_files(
      eng, m, tmp, {file}, o, "export to '" + out + "'",
      [&] {
        std::error_code ec;
        if (std::filesystem::is_directory(out, ec))
          throw error(error_kind::io, "'" + out + "' is a directory",
                      "name the output file, e.g. '" + (std::filesystem::path(out) / "model.safetensors").string() + "'");
      },
      [&] {
        rename_path(data, out, hook);
        const auto parent = std::filesystem::path(out).parent_path().string();
        sync_directory(parent.empty() ? "." : parent, hook);
      });
}

// A sharded checkpoint (a checkpoint directory, or a directory with `latest`) to one file.
inline void export_checkpoint(const std::string& checkpoint, const std::string& out, const export_options& o = {}) {
  check_export_options(o);
  const io_hook* hook = o.hook ? &o.hook : nullptr;
  const directory_handle dir = open_checkpoint(checkpoint, hook);  // its files opened relative to it
  const manifest m = manifest::read(dir, manifest_budget::any_model(), hook);
  std::vector<std::unique_ptr<safetensors_file>> files;
  // The chunk, no larger than the largest tensor needs (from f32, the widest source): a small
  // model's export does not take the whole chunk_bytes.
  std::uint64_t chunk_needed = 0;
  for (const auto& mp : m.params)
    chunk_needed = std::max(chunk_needed, mp.file_transposed
                                              ? detail::transposed_chunk_bytes_for(mp.numel, dtype::f32, o.type)
                                              : chunk_bytes_for(mp.numel, dtype::f32, o.type));
  const std::uint64_t chunk_bytes = chunk_needed > 0 ? std::min<std::uint64_t>(o.chunk_bytes, chunk_needed) : o.chunk_bytes;
  offload::host_memory mem("host (export staging)", std::nullopt, true);
  buffer<offload::host_memory> chunk(mem, dtype::f32, static_cast<std::size_t>((chunk_bytes + 3) / 4), mem_category::scratch);
  for (int q = 0; q < m.world_size; ++q) {
    const auto& mf = m.files[static_cast<std::size_t>(q)];
    file_handle fh = dir.open_file(mf.name, hook);
    if (fh.size() != mf.bytes)  // before its header is read
      throw error(error_kind::io, "'" + fh.path() + "' has " + std::to_string(fh.size()) +
                                      " bytes, the manifest says " + std::to_string(mf.bytes) +
                                      " (truncated or replaced)");
    files.push_back(std::make_unique<safetensors_file>(std::move(fh)));
    verify_file(*files.back(), mf);
  }
  std::error_code ec;
  if (std::filesystem::is_directory(out, ec))
    throw error(error_kind::io, "export to '" + out + "': it is a directory",
                "name the output file, e.g. '" + (std::filesystem::path(out) / "model.safetensors").string() + "'");
  const std::string tmp = out + ".zshard-export.tmp";
  try {
    safetensors_writer w(tmp, export_plan(m.params, o.type), export_metadata(m.params), hook);
    for (const auto& mp : m.params) {
      const state_field fld = mp.trainable ? o.source : state_field::working;
      const dtype from = fld == state_field::working ? mp.type : dtype::f32;
      // a tensor's piece in rank q's file, checked against the manifest
      const auto stored = [&](int q) -> const tensor_entry& {
        const auto [sb, se] = mp.stored_range(q);
        const safetensors_file& f = *files[static_cast<std::size_t>(q)];
        const tensor_entry* t = f.find(field_tensor(mp.name, fld));
        if (!t || t->numel() != se - sb || t->type != file_dtype_of(from))
          throw error(error_kind::io, "'" + f.path() + "' lacks tensor '" + field_tensor(mp.name, fld) + "'",
                      "the rank file does not belong to this manifest");
        return *t;
      };
      if (mp.file_transposed) {
        // elements [g, g + k) of the parameter, from whichever rank files hold them
        const auto read = [&](std::uint64_t g, std::size_t k, void* dst) {
          for (int q = 0; q < m.world_size && k > 0; ++q) {
            const auto [sb, se] = mp.stored_range(q);
            if (g < sb || g >= se) continue;
            const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(k, se - g));
            files[static_cast<std::size_t>(q)]->read(stored(q), g - sb, n, dst);
            dst = static_cast<char*>(dst) + n * size_of(from);
            g += n;
            k -= n;
          }
        };
        detail::copy_transposed_in_file_order(
            static_cast<char*>(chunk.data()), chunk.bytes(), std::uint64_t(mp.shape[0]), std::uint64_t(mp.shape[1]),
            from, o.type, read, [&](const void* src, std::size_t k) { w.write(src, k * size_of(o.type)); });
        continue;
      }
      for (int q = 0; q < m.world_size; ++q) {
        const auto [sb, se] = mp.stored_range(q);
        if (sb >= se) continue;
        const safetensors_file& f = *files[static_cast<std::size_t>(q)];
        const tensor_entry* t = &stored(q);
        chunked_copy(
            static_cast<char*>(chunk.data()), chunk.bytes(), se - sb, from, o.type,
            [&](std::uint64_t first, std::size_t k, void* dst) { f.read(*t, first, k, dst); },
            [&](std::uint64_t, std::size_t k, const void* src) { w.write(src, k * size_of(o.type)); });
      }
    }
    w.finish();
    rename_path(tmp, out, hook);
  } catch (...) {
    std::filesystem::remove(tmp, ec);  // a failed export leaves nothing behind
    throw;
  }
  const auto parent = std::filesystem::path(out).parent_path().string();
  sync_directory(parent.empty() ? "." : parent, hook);
}

}  // namespace zshard::checkpoint

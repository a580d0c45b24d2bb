#pragma once
// load(engine, path): a sharded checkpoint back into an engine, collective, at any world size
// and layout (resharding: element g of a parameter is read from the file of the rank that
// owned g at save time, whatever this rank owns now).
//
// Validate everything, then change anything: each rank checks the manifest against its engine
// (every missing, unexpected or mismatched parameter, in one error), opens every file it will
// read (header, size, tensors, shapes and dtypes), and verifies the CRC32C of its share of
// the files (file q on rank q mod world: every file once, in parallel); one collective makes
// all ranks fail with the same error, naming the file, or all proceed. Only then are the
// shards, optimizer state and run counters written. Memory: one chunk (load_options::
// chunk_bytes) per rank, counted in a ledger (host_staging.hpp).
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/checkpoint_dir.hpp"
#include "zshard/checkpoint/chunked_copy.hpp"
#include "zshard/checkpoint/host_staging.hpp"
#include "zshard/checkpoint/manifest.hpp"
#include "zshard/checkpoint/safetensors_reader.hpp"
#include "zshard/checkpoint/sharded_save.hpp"

namespace zshard::checkpoint {

struct load_options {
  std::size_t chunk_bytes = std::size_t{64} << 20;  // host memory each rank moves data through
  bool verify_checksums = true;                     // CRC32C of every file before anything is loaded
};

struct loaded_checkpoint {
  std::string path;  // the checkpoint directory loaded
  std::int64_t step = 0;
  int saved_world_size = 0;
  std::string user_state;  // what save_options::user_state held on rank 0
};

// The elements of parameter p this rank holds in the engine: [first, second) (its own shard,
// or everything when replicated), and where they start in the shard (always 0).
template <class Engine>
std::pair<std::uint64_t, std::uint64_t> held_range(Engine& eng, param_id p) {
  const auto& l = eng.layout(p);
  return {l.owned_begin(eng.comm().rank()), l.owned_end(eng.comm().rank())};
}

// Checks CRC32C of a whole file. Through a read-only mapping (no copy: the checksum reads the
// page cache, so verifying costs about one pass over memory instead of a copy and a pass; the
// pages are clean file cache, not allocations), or through the chunk where mapping fails.
template <class Staging>
void verify_file(const safetensors_file& f, const manifest_file& want, Staging& chunk) {
  crc32c crc;
  bool mapped = false;
  if (f.size() > 0) {
    file_handle h = file_handle::read_only(f.path());
    void* m = ::mmap(nullptr, f.size(), PROT_READ, MAP_PRIVATE | MAP_POPULATE, h.fd(), 0);
    if (m != MAP_FAILED) {
      ::madvise(m, f.size(), MADV_SEQUENTIAL);
      crc.update(m, f.size());
      ::munmap(m, f.size());
      mapped = true;
    }
  }
  for (std::uint64_t at = 0; !mapped && at < f.size();) {
    const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.bytes(), f.size() - at));
    f.read_bytes(at, chunk.data(), k);
    crc.update(chunk.data(), k);
    at += k;
  }
  if (crc.value() != want.crc32c) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " (CRC32C %08x, the manifest says %08x)", crc.value(), want.crc32c);
    throw error(error_kind::io, "'" + f.path() + "' fails its checksum" + std::string(buf) + ": the file is corrupt",
                "restore the file from a copy, or load an earlier checkpoint");
  }
}

template <class Engine>
loaded_checkpoint load(Engine& eng, const std::string& path, const load_options& o = {}) {
  const std::string what = "checkpoint load from '" + path + "'";
  loaded_checkpoint out;
  manifest m;
  std::map<int, std::unique_ptr<safetensors_file>> files;
  std::vector<const manifest_param*> by_param(eng.spec().params().size(), nullptr);
  std::unique_ptr<host_staging<typename Engine::backend_type>> chunk;

  agree(eng, what, [&] {
    out.path = resolve_checkpoint(path);
    const std::string mpath = out.path + "/" + manifest_file_name;
    m = manifest::parse(read_small_file(mpath), mpath);
    const auto diff = compare_models(m, eng.spec(), eng.config().param_dtype);
    if (!diff.empty()) {
      std::string msg = "'" + mpath + "' is a checkpoint of another model (" + std::to_string(diff.size()) + " difference(s)):";
      for (const auto& d : diff) msg += "\n  " + d;
      throw error(error_kind::config, msg, "load a checkpoint of this model, or build the model the checkpoint holds");
    }
    const run_state& r = m.run;
    if (r.step < 0 || !std::isfinite(r.lr) || r.lr <= 0 || !std::isfinite(r.scaler.scale) || r.scaler.scale <= 0 ||
        r.scaler.skipped_steps < 0 || r.scaler.overflows_at_min_scale < 0 || r.scaler.good_steps_in_row < 0)
      throw error(error_kind::io, "'" + mpath + "' holds invalid run counters (step, learning rate or loss scale)",
                  "the manifest is damaged; load an earlier checkpoint");
    chunk = std::make_unique<host_staging<typename Engine::backend_type>>(eng.backend(), o.chunk_bytes);
    auto open = [&](int q) -> safetensors_file& {
      auto& f = files[q];
      if (!f) {
        const auto& mf = m.files[static_cast<std::size_t>(q)];
        f = std::make_unique<safetensors_file>(out.path + "/" + mf.name);
        if (f->size() != mf.bytes)
          throw error(error_kind::io, "'" + f->path() + "' has " + std::to_string(f->size()) + " bytes, the manifest says " +
                                          std::to_string(mf.bytes) + " (truncated or replaced)",
                      "restore the file, or load an earlier checkpoint");
      }
      return *f;
    };
    for (param_id p = 0; p < by_param.size(); ++p) {
      const auto& name = eng.spec().params()[p].name;
      const manifest_param* mp = &*std::find_if(m.params.begin(), m.params.end(), [&](auto& x) { return x.name == name; });
      by_param[p] = mp;
      const auto [b, e] = held_range(eng, p);
      for (int q = 0; q < m.world_size; ++q) {
        const auto [sb, se] = mp->stored_range(q);
        if (std::max(b, sb) >= std::min(e, se)) continue;
        safetensors_file& f = open(q);
        for (state_field fld : saved_fields(mp->trainable)) {
          const tensor_entry* t = f.find(field_tensor(name, fld));
          const file_dtype want = fld == state_field::working ? file_dtype_of(mp->type) : file_dtype::f32;
          if (!t || t->type != want || t->numel() != se - sb)
            throw error(error_kind::io, "'" + f.path() + "' lacks tensor '" + field_tensor(name, fld) + "' of " +
                                            std::to_string(se - sb) + " " + safetensors_name(want) + " elements",
                        "the rank file does not belong to this manifest; load an earlier checkpoint");
        }
      }
    }
    if (o.verify_checksums)
      for (int q = job_comm(eng).rank(); q < m.world_size; q += job_comm(eng).size()) verify_file(open(q), m.files[static_cast<std::size_t>(q)], *chunk);
    if (m.user_state) {
      const std::string upath = out.path + "/" + m.user_state->name;
      out.user_state = read_small_file(upath, std::size_t{1} << 30);
      if (out.user_state.size() != m.user_state->bytes ||
          crc32c_of(out.user_state.data(), out.user_state.size()) != m.user_state->crc32c)
        throw error(error_kind::io, "'" + upath + "' does not match the size or checksum in the manifest",
                    "restore the file, or load an earlier checkpoint");
    }
    chunk.reset();  // allocated again below, after the agreement's small buffers: the peak is the chunk alone
  });
  chunk = std::make_unique<host_staging<typename Engine::backend_type>>(eng.backend(), o.chunk_bytes);

  // Everything is checked: now change the engine.
  try {
    for (param_id p = 0; p < by_param.size(); ++p) {
      const manifest_param& mp = *by_param[p];
      const auto [b, e] = held_range(eng, p);
      for (int q = 0; q < m.world_size; ++q) {
        const auto [sb, se] = mp.stored_range(q);
        const std::uint64_t lo = std::max(b, sb), hi = std::min(e, se);
        if (lo >= hi) continue;
        const safetensors_file& f = *files.at(q);
        for (state_field fld : saved_fields(mp.trainable)) {
          const tensor_entry& t = *f.find(field_tensor(mp.name, fld));
          const dtype from = fld == state_field::working ? mp.type : dtype::f32;
          const dtype to = fld == state_field::working ? eng.store()[p].type : dtype::f32;
          // host memory of the same dtype: read the file straight into the engine, no staging copy
          auto* direct = from == to ? static_cast<char*>(eng.shard_host_data(p, fld)) : nullptr;
          if (direct)
            f.read(t, lo - sb, hi - lo, direct + (lo - b) * size_of(to));
          else
            chunked_copy(
                chunk->bytes_at(0), chunk->bytes(), hi - lo, from, to,
                [&](std::uint64_t first, std::size_t k, void* dst) { f.read(t, lo - sb + first, k, dst); },
                [&](std::uint64_t first, std::size_t k, const void* src) { eng.write_shard(p, fld, lo - b + first, src, k); });
        }
      }
    }
    eng.restore_run_counters(m.run);
  } catch (const error& e) {
    throw error(e.kind(), what + ": failed after validation, the engine is partly loaded: " + e.message(),
                "load again, or rebuild the engine");
  }
  out.step = m.run.step;
  out.saved_world_size = m.world_size;
  return out;
}

}  // namespace zshard::checkpoint

#pragma once
// load(engine, path): a sharded checkpoint back into an engine, collective, at any world size
// and layout (resharding: element g of a parameter is read from the file of the rank that
// owned g at save time, whatever this rank owns now).
//
// Nothing outside the checkpoint, nothing that blocks: the checkpoint directory is held open and
// every file opened relative to it by a name a save writes, never through a symbolic link, non-
// blocking, a regular file whose size matches the manifest before anything of it is read
// (checkpoint_dir.hpp: open_checkpoint; directory_handle.hpp); the manifest is bounded by what a
// manifest of this engine's model can hold (manifest.hpp: manifest_budget) before it is parsed.
//
// Validate, then change: each rank checks the manifest against its engine (every missing,
// unexpected or mismatched parameter, in one error; the run counters and per-parameter update
// counts), opens every file it will read (header, size, tensors, shapes and dtypes) and checks
// the user's state; one collective makes all ranks fail with the same error, naming the file,
// or all proceed. Then the shards and optimizer state are read, and each file's CRC32C is
// verified in the same pass (verified_reads.hpp; file q by rank q mod world, which is the rank
// that reads all of it when the layout is unchanged: every file once, in parallel); a second
// collective makes every rank fail alike if a file is corrupt, and only then are the run
// counters and update counts restored. A file corrupt inside its tensor data is thus found with
// the engine partly loaded (the error says so; a later successful load overwrites everything);
// load_options::verify_before_loading verifies every file before anything changes instead, at
// the price of a second read. Memory: at most one chunk (load_options::chunk_bytes) per rank,
// counted in a ledger (host_staging.hpp), allocated only when a piece needs staging (a dtype
// conversion, device memory), and no larger than the largest such piece needs; plus a 64 KiB
// bounce buffer on the stack (verified_reads.hpp).
//
// Older formats still load, and the load says once in the log (engine_config::log) what they
// lack: version 1 has no per-parameter update counts (every parameter's AdamW count continues
// from the run's step), versions 1 and 2 no checksum of the manifest itself (manifest.hpp).
//
// Frozen parameters: a checkpoint holds the optimizer state a frozen parameter kept
// (set_trainable), and the load writes it, creating it first where this engine has none (an
// Offloader that cannot, state on NVMe, is refused before anything changes, naming the
// parameter). A parameter whose state the checkpoint lacks (it never trained, or a version 1 to
// 3 checkpoint) starts its state over as a first unfreeze would: master from the loaded working
// value, m = v = 0, update count 0. Where its saved count was above 0 (moments lost in an older
// format) the load refuses, naming it, unless load_options::restart_lost_frozen_state allows the
// restart (the log then names it): continuing with zero moments is not the run that was saved.
#include <algorithm>
#include <cmath>
#include <cstring>
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
#include "zshard/checkpoint/verified_reads.hpp"

namespace zshard::checkpoint {

struct load_options {
  std::size_t chunk_bytes = std::size_t{64} << 20;  // host memory each rank moves data through, at most
  bool verify_checksums = true;                     // CRC32C of every file, in the same pass as the load
  // true: verify every file in a pass of its own before anything is loaded, so that a corrupt
  // file leaves the engine untouched (costs a second read of every file)
  bool verify_before_loading = false;
  io_hook hook{};  // tests: sees every file-system call of the load (io_hook.hpp): a failing disk, a truncated file
  // A format 1 to 3 checkpoint lacks the optimizer state of parameters frozen at the save; where
  // one had updates (its m and v are lost), the load refuses unless this is true: then their
  // AdamW state starts over (update count 0, m = v = 0), which is not the run that was saved.
  bool restart_lost_frozen_state = false;
};

struct loaded_checkpoint {
  std::string path;  // the checkpoint directory loaded
  std::int64_t step = 0;
  int saved_world_size = 0;
  std::string user_state;  // what save_options::user_state held on rank 0
  // false: a format 1 checkpoint without per-parameter update counts (each continued from `step`)
  bool update_counts_restored = false;
  // false: a format 1 or 2 checkpoint, whose manifest has no checksum of its own
  bool manifest_verified = false;
  // false: a frozen parameter had updates (count above 0) but its kept optimizer state is not in
  // the checkpoint (format 1 to 3); its state started over (the log names it)
  bool frozen_state_restored = true;
};

// The elements of parameter p this rank holds in the engine: [first, second) (its own shard,
// or everything when replicated), and where they start in the shard (always 0).
template <class Engine>
std::pair<std::uint64_t, std::uint64_t> held_range(Engine& eng, param_id p) {
  const auto& l = eng.layout(p);
  return {l.owned_begin(eng.comm().rank()), l.owned_end(eng.comm().rank())};
}

// p's optimizer state as a first unfreeze creates it: master = the working shard widened to f32,
// m = v = 0 (the whole shard, padding included), through the one chunk.
template <class Engine, class Chunk>
void restart_state(Engine& eng, param_id p, Chunk& chunk) {
  const std::uint64_t n = eng.layout(p).shard_numel;
  const dtype t = eng.store()[p].type;
  chunked_copy(
      static_cast<char*>(chunk.data()), chunk.bytes(), n, t, dtype::f32,
      [&](std::uint64_t first, std::size_t k, void* dst) { eng.read_shard(p, state_field::working, first, dst, k); },
      [&](std::uint64_t first, std::size_t k, const void* src) { eng.write_shard(p, state_field::master, first, src, k); });
  for (state_field f : {state_field::m, state_field::v})
    chunked_copy(
        static_cast<char*>(chunk.data()), chunk.bytes(), n, dtype::f32, dtype::f32,
        [&](std::uint64_t, std::size_t k, void* dst) { std::memset(dst, 0, k * sizeof(float)); },
        [&](std::uint64_t first, std::size_t k, const void* src) { eng.write_shard(p, f, first, src, k); });
}

template <class Engine>
loaded_checkpoint load(Engine& eng, const std::string& path, const load_options& o = {}) {
  // Files are checked (and messages said) by the job's ranks, every replica of a hybrid layout
  // included; what a rank reads into its engine depends on its shard group only.
  const int rank = job_comm(eng).rank(), world = job_comm(eng).size();
  const std::string what = "checkpoint load from '" + path + "'";
  const io_hook* hook = o.hook ? &o.hook : nullptr;
  loaded_checkpoint out;
  manifest m;
  std::map<int, std::unique_ptr<safetensors_file>> files;
  std::vector<const manifest_param*> by_param(eng.spec().params().size(), nullptr);
  std::string lost;  // frozen parameters whose updates were saved but not their moments (format 1 to 3)
  // Allocated at the first piece that needs it (a dtype conversion, device memory): a load
  // into host memory of the same dtypes reads straight into the engine and allocates nothing.
  lazy_host_staging<typename Engine::backend_type> chunk(eng.backend(), o.chunk_bytes);

  directory_handle dir;  // every file of the checkpoint is opened relative to it (directory_handle.hpp)

  agree(eng, what, [&] {
    dir = open_checkpoint(path, hook);
    out.path = dir.path();
    const std::string mpath = out.path + "/" + manifest_file_name;
    m = manifest::read(dir, manifest_budget::for_model(eng.spec()), hook);
    const auto diff = compare_models(m, eng.spec(), eng.config().param_dtype);
    if (!diff.empty()) {
      std::string msg =
          "'" + mpath + "' is a checkpoint of another model than " + eng.spec().label() + " (" +
          std::to_string(diff.size()) + " difference(s)):";
      for (const auto& d : diff) msg += "\n  " + d;
      throw error(error_kind::config, msg, "load a checkpoint of this model, or build the model the checkpoint holds");
    }
    const run_state& r = m.run;
    if (r.step < 0 || !std::isfinite(r.lr) || r.lr <= 0 || !std::isfinite(r.scaler.scale) || r.scaler.scale <= 0 ||
        r.scaler.skipped_steps < 0 || r.scaler.overflows_at_min_scale < 0 || r.scaler.good_steps_in_row < 0)
      throw error(error_kind::io, "'" + mpath + "' holds invalid run counters (step, learning rate or loss scale)",
                  "the manifest is damaged; load an earlier checkpoint");
    ZSHARD_REQUIRE(o.chunk_bytes >= 128, error_kind::config,
                   "load_options::chunk_bytes of " + std::to_string(o.chunk_bytes) + " is too small",
                   "use a chunk of at least a few KiB (e.g. 64 MiB)");
    auto open = [&](int q) -> safetensors_file& {
      auto& f = files[q];
      if (!f) {
        const auto& mf = m.files[static_cast<std::size_t>(q)];
        file_handle fh = dir.open_file(mf.name, hook);
        if (fh.size() != mf.bytes)  // before its header is read
          throw error(error_kind::io,
                      "'" + fh.path() + "' has " + std::to_string(fh.size()) + " bytes, the manifest says " +
                          std::to_string(mf.bytes) + " (truncated or replaced)",
                      "restore the file, or load an earlier checkpoint");
        f = std::make_unique<safetensors_file>(std::move(fh));
      }
      return *f;
    };
    for (param_id p = 0; p < by_param.size(); ++p) {
      const auto& name = eng.spec().params()[p].name;
      const manifest_param* mp =
          &*std::find_if(m.params.begin(), m.params.end(), [&](auto& x) { return x.name == name; });
      by_param[p] = mp;
      if (mp->optimizer_state && !eng.can_add_optimizer_state(p))
        throw error(error_kind::config,
                    "'" + mpath + "' holds the optimizer state that frozen parameter '" + name +
                        "' kept (set_trainable), but this engine has none for it and its Offloader cannot create it "
                        "(e.g. optimizer state on NVMe, which has room only for the parameters trainable when the engine "
                        "was built)",
                    "build the engine with '" + name + "' trainable and freeze it (set_trainable) before the load");
      const auto [b, e] = held_range(eng, p);
      for (int q = 0; q < m.world_size; ++q) {
        const auto [sb, se] = mp->stored_range(q);
        if (std::max(b, sb) >= std::min(e, se)) continue;
        safetensors_file& f = open(q);
        for (state_field fld : saved_fields(mp->optimizer_state)) {
          const tensor_entry* t = f.find(field_tensor(name, fld));
          const file_dtype want = fld == state_field::working ? file_dtype_of(mp->type) : file_dtype::f32;
          if (t && t->type == want && t->numel() != se - sb)  // the file is as saved (its size matched): the layout is not
            throw error(error_kind::io,
                        "'" + mpath + "' gives parameter '" + name + "' a layout (shard_numel " +
                            std::to_string(mp->shard_numel) + " over " + std::to_string(m.world_size) +
                            " ranks) under which '" + f.path() + "' would hold " + std::to_string(se - sb) +
                            " elements of it, but that file (of the size the manifest lists) holds " +
                            std::to_string(t->numel()) + ": the manifest was changed after the save",
                        "restore manifest.json from a copy, or load an earlier checkpoint");
          if (!t || t->type != want || t->numel() != se - sb)
            throw error(error_kind::io,
                        "'" + f.path() + "' lacks tensor '" + field_tensor(name, fld) + "' of " +
                            std::to_string(se - sb) + " " + safetensors_name(want) + " elements",
                        "the rank file does not belong to this manifest; load an earlier checkpoint");
        }
      }
    }
    for (param_id p = 0; p < by_param.size(); ++p)  // frozen with updates, but their moments were not saved
      if (m.update_counts && !by_param[p]->optimizer_state &&
          (*m.update_counts)[static_cast<std::size_t>(by_param[p] - m.params.data())] > 0)
        lost += std::string(lost.empty() ? "" : ", ") + "'" + by_param[p]->name + "'";
    if (!lost.empty() && !o.restart_lost_frozen_state)
      throw error(error_kind::config,
                  "'" + mpath + "' (format version " + std::to_string(m.version) +
                      ") lacks the optimizer state (m, v) of frozen parameter(s) " + lost +
                      ", which had updates before they were frozen: a resumed run would not be the run that was saved",
                  "set load_options::restart_lost_frozen_state to start their AdamW state over (update count 0, "
                  "m = v = 0); checkpoints of format " + std::to_string(manifest_version) + " keep it");
    if (o.verify_checksums && o.verify_before_loading)
      for (int q = rank; q < m.world_size; q += world) verify_file(open(q), m.files[static_cast<std::size_t>(q)]);
    if (o.verify_checksums && !o.verify_before_loading)
      for (int q = rank; q < m.world_size; q += world) open(q);  // read below, all of it, to verify it
    if (m.user_state) {
      const file_handle uf = dir.open_file(m.user_state->name, hook);
      if (uf.size() != m.user_state->bytes)  // before anything is allocated or read
        throw error(error_kind::io,
                    "'" + uf.path() + "' has " + std::to_string(uf.size()) + " bytes, the manifest says " +
                        std::to_string(m.user_state->bytes) + " (truncated or replaced)",
                    "restore the file, or load an earlier checkpoint");
      out.user_state = read_whole(uf, std::size_t{1} << 30);
      if (crc32c_of(out.user_state.data(), out.user_state.size()) != m.user_state->crc32c)
        throw error(error_kind::io, "'" + uf.path() + "' does not match the checksum in the manifest",
                    "restore the file, or load an earlier checkpoint");
    }
  });

  // Everything but the tensor data is checked: now load, verifying in the same pass.
  const std::string partly = "failed after validation, the engine is partly loaded: ";
  agree(eng, what, [&] {
    try {
      std::map<int, std::vector<load_piece>> pieces;
      for (param_id p = 0; p < by_param.size(); ++p)  // a frozen parameter's saved state needs a place
        if (by_param[p]->optimizer_state) eng.add_optimizer_state(p);
      for (param_id p = 0; p < by_param.size(); ++p) {
        const manifest_param& mp = *by_param[p];
        const auto [b, e] = held_range(eng, p);
        for (int q = 0; q < m.world_size; ++q) {
          const auto [sb, se] = mp.stored_range(q);
          const std::uint64_t lo = std::max(b, sb), hi = std::min(e, se);
          if (lo >= hi) continue;
          for (state_field fld : saved_fields(mp.optimizer_state)) {
            const tensor_entry& t = *files.at(q)->find(field_tensor(mp.name, fld));
            load_piece pc;
            pc.from = fld == state_field::working ? mp.type : dtype::f32;
            pc.to = fld == state_field::working ? eng.store()[p].type : dtype::f32;
            pc.offset = t.begin + (lo - sb) * size_of(pc.from);
            pc.numel = hi - lo;
            // host memory of the same dtype: the file is read straight into the engine, no staging copy
            if (pc.from == pc.to)
              if (auto* direct = static_cast<char*>(eng.shard_host_data(p, fld)))
                pc.direct = direct + (lo - b) * size_of(pc.to);
            if (!pc.direct)
              pc.write = [&eng, p, fld, at = lo - b](std::uint64_t first, std::size_t k, const void* src) {
                eng.write_shard(p, fld, at + first, src, k);
              };
            pieces[q].push_back(std::move(pc));
          }
        }
      }
      // The chunk, sized for the largest piece that goes through it (a conversion, device memory)
      // and the largest state that starts over.
      std::uint64_t chunk_needed = 0;
      for (const auto& [q, list] : pieces)
        for (const load_piece& pc : list)
          if (!pc.direct) chunk_needed = std::max(chunk_needed, chunk_bytes_for(pc.numel, pc.from, pc.to));
      for (param_id p = 0; p < by_param.size(); ++p)
        if (!by_param[p]->optimizer_state && eng.has_optimizer_state(p))
          chunk_needed = std::max(chunk_needed,
                                  chunk_bytes_for(eng.layout(p).shard_numel, eng.store()[p].type, dtype::f32));
      chunk.fit(chunk_needed);
      const bool verify_now = o.verify_checksums && !o.verify_before_loading;
      for (auto& [q, f] : files) {
        const bool mine = verify_now && q % world == rank;
        auto it = pieces.find(q);
        if (it == pieces.end() && !mine) continue;
        read_pieces(*f, it == pieces.end() ? std::vector<load_piece>{} : std::move(it->second),
                    mine ? &m.files[static_cast<std::size_t>(q)] : nullptr, chunk);
      }
      for (param_id p = 0; p < by_param.size(); ++p)  // state the checkpoint lacks starts over
        if (!by_param[p]->optimizer_state && eng.has_optimizer_state(p)) restart_state(eng, p, chunk);
      chunk.reset();  // before the agreement's small buffers: the peak stays the chunk alone
    } catch (const error& e) {
      chunk.reset();
      throw error(e.kind(), partly + e.message(),  // agree() names the load and the rank
                  e.hint() + (e.hint().empty() ? "" : "; ") +
                      "a load that succeeds overwrites every field (load_options::verify_before_loading "
                      "keeps the engine untouched by a corrupt file)");
    }
  });
  try {
    eng.restore_run_counters(m.run);
    // A parameter without saved state starts over at count 0; format 1: the others at the step.
    std::vector<std::int64_t> counts(by_param.size(), m.run.step);
    for (param_id p = 0; p < by_param.size(); ++p) {
      const auto i = static_cast<std::size_t>(by_param[p] - m.params.data());
      if (m.update_counts) counts[p] = (*m.update_counts)[i];
      if (!by_param[p]->optimizer_state) counts[p] = 0;
    }
    if (m.update_counts || std::any_of(by_param.begin(), by_param.end(), [](auto* mp) { return !mp->optimizer_state; }))
      eng.restore_update_counts(counts);
    out.update_counts_restored = m.update_counts.has_value();
    out.frozen_state_restored = lost.empty();
    if (rank == 0 && !lost.empty())
      eng.config().say("checkpoint '" + out.path + "' (format version " + std::to_string(m.version) +
                       ") lacks the optimizer state of frozen parameter(s) " + lost +
                       ", which had updates before they were frozen: their AdamW state starts over (update count 0, "
                       "m = v = 0) when unfrozen; a save from this engine writes format " +
                       std::to_string(manifest_version) + ", which keeps it");
    if (rank == 0 && (!m.update_counts || !m.checksummed)) {  // what an older format lacks, in one note
      std::string lacks;
      if (!m.update_counts)
        lacks = "no per-parameter update counts: every parameter's AdamW bias correction continues from the run's "
                "step " +
                std::to_string(m.run.step) + ", exact only if every parameter had a gradient in every step before the save";
      if (!m.checksummed)
        lacks += std::string(lacks.empty() ? "" : "; and ") +
                 "no checksum of its manifest: damage to manifest.json is found only where it breaks the JSON or a "
                 "range check";
      eng.config().say("checkpoint '" + out.path + "' (format version " + std::to_string(m.version) + ") has " + lacks +
                       "; a save from this engine writes format " + std::to_string(manifest_version));
    }
    out.manifest_verified = m.checksummed;
  } catch (const error& e) {
    throw error(e.kind(), what + ": " + partly + e.message(), "load again, or rebuild the engine");
  }
  out.step = m.run.step;
  out.saved_world_size = m.world_size;
  return out;
}

}  // namespace zshard::checkpoint

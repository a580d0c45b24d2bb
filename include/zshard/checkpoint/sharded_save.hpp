#pragma once
// save(engine, dir): a sharded checkpoint, collective (every rank calls it, between steps).
//
//  0. The ranks agree on every setting the checkpoint records (the step, the loss scaler's state,
//     each parameter group's learning rate, each parameter's flags: recorded_settings.hpp), or
//     every rank fails naming each setting and the ranks that differ, before anything is written.
//  1. Rank 0 creates DIR, removes leftovers of crashed saves, picks the checkpoint's name and
//     creates its temporary directory; one small collective tells every rank the name, or the
//     error (an unwritable directory fails here, on every rank, before anyone writes).
//  2. Every rank streams its own state into rank-0000r.safetensors (manifest.hpp): parameter
//     by parameter through one chunk of at most save_options::chunk_bytes (no larger than the
//     largest field needs), CRC32C on the way, fsync. Fields in host memory (the host backend's
//     shards, offload::host_adam's state) are written from where they live, and a rank that has
//     only those allocates no chunk. A frozen
//     parameter's kept optimizer state (set_trainable) is saved like a trainable one's: its
//     update count is, and resuming it with zero moments would not be the same run.
//  3. Ranks meet through marker files, not a collective (rank_writes.hpp): a slow disk cannot
//     trip the communicator's timeout. Any rank's failure (a full disk included: posting a
//     marker needs no space) fails the save on every rank at once, with that rank's error.
//  4. Rank 0 writes the user's state and manifest.json (sizes and CRC32C of every file, rank 0's
//     per-parameter update counts: it holds elements of every parameter), fsyncs
//     them and the directory, renames it into place, switches `latest` (checkpoint_dir.hpp)
//     and removes checkpoints beyond keep_last; a last small collective reports the outcome.
// A failure or crash anywhere leaves the previous checkpoint and `latest` as they were. The
// engine is only read.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "zshard/checkpoint/agreement.hpp"
#include "zshard/checkpoint/checkpoint_dir.hpp"
#include "zshard/checkpoint/chunked_copy.hpp"
#include "zshard/checkpoint/host_staging.hpp"
#include "zshard/checkpoint/manifest.hpp"
#include "zshard/checkpoint/rank_writes.hpp"
#include "zshard/checkpoint/recorded_settings.hpp"
#include "zshard/checkpoint/safetensors_writer.hpp"

namespace zshard::checkpoint {

struct save_options {
  std::size_t keep_last = 0;  // complete checkpoints to keep in DIR (0: all)
  std::string user_state{};   // the training stack's own bytes (data position, ...); rank 0's is saved
  std::size_t chunk_bytes = std::size_t{64} << 20;                  // host memory each rank moves data through, at most
  std::chrono::milliseconds io_timeout = std::chrono::minutes(30);  // how long ranks wait for the slowest writer
  io_hook hook{};  // tests: sees every file-system call of the save (io_hook.hpp): a full disk, a slow one, a crash
};

struct saved_checkpoint {
  std::string path;  // DIR/step-...
  std::int64_t step = 0;
  std::uint64_t rank_bytes = 0;  // this rank's file
};

// The model and layouts part of the manifest (files, run state filled by the caller).
template <class Engine>
manifest describe_engine(Engine& eng) {
  manifest m;
  m.world_size = eng.comm().size();
  m.run = eng.run_counters();
  // Rank 0's counts (it holds elements of every parameter); an Offloader without counts: the step.
  m.update_counts = eng.update_counts();
  if (m.update_counts->empty()) m.update_counts->assign(eng.spec().params().size(), m.run.step);
  for (param_id p = 0; p < eng.spec().params().size(); ++p) {
    const auto& ps = eng.spec().params()[p];
    const auto& l = eng.layout(p);
    manifest_param mp;
    mp.name = ps.name;
    for (int i = 0; i < ps.shape.rank(); ++i) mp.shape.push_back(ps.shape[i]);
    mp.type = eng.store()[p].type;
    mp.trainable = ps.trainable;
    mp.optimizer_state = eng.has_optimizer_state(p);
    mp.decay = ps.decay;
    mp.numel = l.numel;
    mp.shard_numel = l.shard_numel;
    mp.replicated = l.replicated;
    mp.file_transposed = ps.file_transposed;
    m.params.push_back(std::move(mp));
  }
  return m;
}

// The fields a file holds of a parameter: its optimizer state only when it has one.
inline std::vector<state_field> saved_fields(bool optimizer_state) {
  if (optimizer_state) return {state_field::working, state_field::master, state_field::m, state_field::v};
  return {state_field::working};
}

// Rank `rank`'s file of checkpoint `m` from the engine's shards.
template <class Engine, class Staging>
written_file write_rank_file(Engine& eng, const manifest& m, int rank, const std::string& path, Staging& chunk,
                             const io_hook* hook) {
  std::vector<planned_tensor> plan;
  for (const auto& p : m.params) {
    const auto [b, e] = p.stored_range(rank);
    if (e == b) continue;
    for (state_field f : saved_fields(p.optimizer_state))
      plan.push_back({field_tensor(p.name, f),
                      f == state_field::working ? file_dtype_of(p.type) : file_dtype::f32,
                      {static_cast<std::int64_t>(e - b)}});
  }
  // The fields in file order; those in host memory are written from where they live, the others
  // through the chunk, sized for the largest of them.
  struct field_write {
    param_id p;
    state_field f;
    dtype t;
    std::uint64_t n;
    const void* direct;
  };
  std::vector<field_write> fields;
  std::uint64_t chunk_needed = 0;
  for (param_id p = 0; p < m.params.size(); ++p) {
    const auto& mp = m.params[p];
    const auto [b, e] = mp.stored_range(rank);
    for (state_field f : e == b ? std::vector<state_field>{} : saved_fields(mp.optimizer_state)) {
      const dtype t = f == state_field::working ? mp.type : dtype::f32;
      fields.push_back({p, f, t, e - b, eng.shard_host_data(p, f)});
      if (!fields.back().direct) chunk_needed = std::max(chunk_needed, chunk_bytes_for(e - b, t, t));
    }
  }
  chunk.fit(chunk_needed);
  safetensors_writer w(path, std::move(plan),
                       {{"zshard_rank", std::to_string(rank)}, {"zshard_world", std::to_string(m.world_size)}}, hook);
  for (const field_write& fw : fields) {
    if (fw.direct) {
      w.write(fw.direct, fw.n * size_of(fw.t));
      continue;
    }
    chunked_copy(
        static_cast<char*>(chunk.data()), chunk.bytes(), fw.n, fw.t, fw.t,
        [&](std::uint64_t first, std::size_t k, void* dst) { eng.read_shard(fw.p, fw.f, first, dst, k); },
        [&](std::uint64_t, std::size_t k, const void* src) { w.write(src, k * size_of(fw.t)); });
  }
  return w.finish();
}

template <class Engine>
saved_checkpoint save(Engine& eng, const std::string& dir, const save_options& o = {}) {
  // Ranks meet over the whole job; under hybrid sharding only replica 0's shard group writes its
  // files (the other replicas hold the same bits) and the checkpoint has shard-group-size files.
  const int rank = job_comm(eng).rank(), world = job_comm(eng).size();
  const int file_rank = eng.comm().rank(), files = eng.comm().size();
  const bool writes = replica_of(eng) == 0;
  const std::string what = "checkpoint save to '" + dir + "'";
  const io_hook* hook = o.hook ? &o.hook : nullptr;
  // 0. what the checkpoint records (rank 0's) is every rank's, or nothing is written
  check_recorded_settings(eng, what);
  manifest m = describe_engine(eng);

  // 1. rank 0 prepares; everyone learns the name or the error
  std::string name;
  agree(eng, what, [&] {
    if (rank != 0) return;
    make_directories(dir, hook);
    remove_stale_temporaries(dir, hook);
    name = new_checkpoint_name(dir, m.run.step);
    const std::string tmp = dir + "/." + name + ".tmp";
    make_directories(tmp, hook);
    make_directories(dir + "/." + name + ".markers.tmp", hook);
    prepare_markers(dir + "/." + name + ".markers.tmp", world, hook);
    if (::access(tmp.c_str(), W_OK) != 0) throw_io("cannot write into", tmp, errno, "choose a writable directory");
  });
  name = exchange_messages(eng, name)[0];
  const std::string tmp = dir + "/." + name + ".tmp", final_path = dir + "/" + name;
  // Markers live apart from the data: the checkpoint directory is renamed while slower ranks
  // may still be reading them; rank 0 removes them once every rank is past the last collective.
  const std::string markers = dir + "/." + name + ".markers.tmp";

  // 2. every rank writes its file; 3. meet through markers
  const std::string path = tmp + "/" + rank_file_name(file_rank);
  const std::vector<std::string> reports = write_and_meet(
      eng, markers, o.io_timeout, what,
      [&]() -> std::string {
        if (!writes) return "";  // a replica other than 0 under hybrid sharding: replica 0 writes
        lazy_host_staging<typename Engine::backend_type> chunk(eng.backend(), o.chunk_bytes);
        const written_file wf = write_rank_file(eng, m, file_rank, path, chunk, hook);
        return std::to_string(wf.bytes) + " " + std::to_string(wf.crc);
      },
      [&] {
        if (!writes) return;
        try {
          remove_path(path, hook);  // give back the space the partial file holds
        } catch (const error&) {
        }
      },
      hook);

  // 4. rank 0 commits
  agree(eng, what, [&] {
    if (rank != 0) return;
    for (int q = 0; q < files; ++q) {  // replica 0's ranks are the job's ranks 0 .. files - 1
      const std::string& t = reports[static_cast<std::size_t>(q)];
      const auto space = t.find(' ');
      m.files.push_back({rank_file_name(q), std::stoull(t.substr(0, space)),
                         static_cast<std::uint32_t>(std::stoul(t.substr(space + 1)))});
    }
    m.user_state =
        manifest_file{user_state_file, o.user_state.size(), crc32c_of(o.user_state.data(), o.user_state.size())};
    write_small_file(tmp + "/" + user_state_file, o.user_state, hook);
    write_small_file(tmp + "/" + manifest_file_name, m.to_json(), hook);
    sync_directory(tmp, hook);
    rename_path(tmp, final_path, hook);
    sync_directory(dir, hook);
    set_latest(dir, name, hook);
    rotate_checkpoints(dir, o.keep_last, name, hook);
  });
  std::error_code ec;
  if (rank == 0) try {
      remove_tree(markers, hook);
    } catch (const error&) {  // leftovers: the next save removes them
    }
  return {final_path, m.run.step, std::filesystem::file_size(final_path + "/" + rank_file_name(file_rank), ec)};
}

}  // namespace zshard::checkpoint

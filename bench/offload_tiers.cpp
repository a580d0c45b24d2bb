// offload_tiers: how close do the tiers beyond the device come to what their hardware does?
//
//   nvme step   host_adam's optimizer step with master, m and v on disk (offload_config::
//               optimizer_state = nvme: every chunk read, updated by AdamW, written to the other
//               slot) next to the disk's own sequential read and write of the same bytes in the
//               same run and directory (O_DIRECT where the filesystem allows, chunk-sized
//               transfers, one thread). nvme_step_vs_disk = (read time + write time) / step time:
//               1.0 means the step costs what moving its state costs, AdamW and the pipeline
//               hidden behind the disk (target >= 0.8). Beside it the same step with the state
//               in memory: the compute the pipeline hides (nvme_step_vs_memory_step: 1.0 when
//               the disk is hidden behind AdamW instead).
//   upload      the upload of offloaded parameter shards for their gathers (offload/param_tier.hpp:
//               stage every shard of a group, then release the staged copies) next to a plain
//               memcpy of the same bytes into a buffer allocated once. On the host backend an
//               upload is a memcpy into a staging buffer from the backend's block cache; on a GPU
//               it is cudaMemcpyAsync from page-locked memory on the host_copy stream.
//               param_upload_vs_copy = copy time / upload time (target >= 0.9).
//
// Times are the best of several rounds after a warm-up. Usage:
//   offload_tiers [--scratch DIR] [--quick]
// DIR holds the state file and the baseline's file (default: the temp directory); --quick uses
// a quarter of the bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/partition/even_partitioner.hpp"

namespace {

using namespace zshard;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::vector<shard_layout> layouts_of(const model_spec& spec, dtype t) {
  std::vector<shard_layout> l;
  const partition::even partitioner{};
  for (param_id p = 0; p < spec.params().size(); ++p)
    l.push_back(partitioner.layout(param_identity::of(spec, p, t), 1, partition_config{}));
  return l;
}

model_spec model(int params, std::size_t numel) {
  model_spec spec;
  std::vector<param_id> ids;
  for (int i = 0; i < params; ++i) ids.push_back(spec.add_param("w" + std::to_string(i), {std::int64_t(numel)}));
  spec.add_module("all", ids);
  return spec;
}

struct nvme_figures {
  double step_s = 0, memory_step_s = 0, read_s = 0, write_s = 0;
  std::uint64_t bytes = 0;  // one slot: what a step reads and writes
  bool direct = false;
};

// The best time of host_adam's update over `rounds` steps (after a warm-up step), the state
// where `oc` says.
template <class Body>
double step_time(const model_spec& spec, std::size_t numel, const offload_config& oc, int rounds, Body&& after) {
  const auto layouts = layouts_of(spec, dtype::bf16);
  host_backend backend;
  null_comm comm(0, 1);
  param_store<host_backend> store(backend, spec, layouts, dtype::bf16);
  optim::adamw_config hyper;
  hyper.lr = 1e-3f;
  offload::host_adam_impl<host_backend, null_comm> opt(store, comm, hyper, oc);
  std::vector<float> values(numel), grad(numel);
  for (std::size_t i = 0; i < numel; ++i) {
    values[i] = float(i % 1000) * 1e-3f;
    grad[i] = float(i % 77) * 1e-4f - 3e-3f;
  }
  for (param_id p = 0; p < spec.params().size(); ++p) opt.init_param(p, values.data());
  auto& stream = store.streams().on(stream_role::reduce);
  double best = 1e30;
  for (int r = 0; r <= rounds; ++r) {
    for (param_id p = 0; p < spec.params().size(); ++p) opt.accumulate_grad(p, grad.data(), numel, stream);
    (void)opt.local_grad_stats();
    const auto t0 = clock_type::now();
    opt.update({r + 1, 1e-3f, 1.0f, nullptr});
    if (r > 0) best = std::min(best, seconds_since(t0));  // round 0 warms up
  }
  after(opt);
  return best;
}

nvme_figures nvme_step(const std::string& dir, int params, std::size_t numel, int rounds, int io_threads) {
  const model_spec spec = model(params, numel);
  offload_config oc;
  oc.host_threads = 2;
  nvme_figures f;
  f.memory_step_s = step_time(spec, numel, oc, rounds, [](auto&) {});  // the same update, state in memory
  oc.optimizer_state = offload_tier::nvme;
  oc.nvme_path = dir;
  oc.nvme_chunk_numel = std::size_t{1} << 20;  // 12 MiB chunks
  oc.nvme_buffer_count = 4;
  oc.nvme_io_threads = io_threads;
  std::size_t chunks = 0, chunk_bytes = 0;
  f.step_s = step_time(spec, numel, oc, rounds, [&](auto& opt) {
    chunks = opt.nvme()->chunks();
    chunk_bytes = opt.nvme()->chunk_bytes();
    f.direct = opt.nvme()->file()->direct();
  });
  struct {
    std::size_t chunks_, bytes_;
    std::size_t chunks() const { return chunks_; }
    std::size_t chunk_bytes() const { return bytes_; }
  } shape{chunks, chunk_bytes}, *n = &shape;
  f.bytes = std::uint64_t(n->chunks()) * n->chunk_bytes();
  // The disk alone: one slot's bytes read, then written, sequentially, in the same chunks.
  offload::nvme_file file(dir, "zshard-bench-disk", f.bytes);
  offload::host_memory memory("bench", std::nullopt, true);
  buffer<offload::host_memory> buf(memory, dtype::f32, n->chunk_bytes() / 4, mem_category::scratch);
  std::memset(buf.data(), 1, n->chunk_bytes());
  for (std::uint64_t at = 0; at < f.bytes; at += n->chunk_bytes()) file.write(buf.data(), n->chunk_bytes(), at);
  f.read_s = f.write_s = 1e30;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = clock_type::now();
    for (std::uint64_t at = 0; at < f.bytes; at += n->chunk_bytes()) file.read(buf.data(), n->chunk_bytes(), at);
    f.read_s = std::min(f.read_s, seconds_since(t0));
    t0 = clock_type::now();
    for (std::uint64_t at = 0; at < f.bytes; at += n->chunk_bytes()) file.write(buf.data(), n->chunk_bytes(), at);
    f.write_s = std::min(f.write_s, seconds_since(t0));
  }
  return f;
}

struct upload_figures {
  double upload_s = 0, copy_s = 0;
  std::uint64_t bytes = 0;
};

upload_figures upload(int params, std::size_t numel, int rounds) {
  const model_spec spec = model(params, numel);
  const auto layouts = layouts_of(spec, dtype::bf16);
  host_backend backend;
  param_store<host_backend> store(backend, spec, layouts, dtype::bf16, false, nullptr, /*offload_shards=*/true);
  offload::host_memory memory("host (parameter shards)", std::nullopt, true);
  offload::param_tier<host_backend, offload::host_memory> tier(store, memory);
  for (param_id p = 0; p < spec.params().size(); ++p) std::memset(tier.host_shard(p), 0x3c, numel * 2);
  std::vector<char> dst(numel * 2 * std::size_t(params));
  std::memset(dst.data(), 0, dst.size());
  upload_figures f;
  f.bytes = dst.size();
  f.upload_s = f.copy_s = 1e30;
  for (int r = 0; r <= rounds; ++r) {
    auto t0 = clock_type::now();
    for (param_id p = 0; p < spec.params().size(); ++p) (void)tier.stage(p, stream_role::gather);
    tier.unstage(stream_role::gather);
    if (r > 0) f.upload_s = std::min(f.upload_s, seconds_since(t0));
    t0 = clock_type::now();
    for (param_id p = 0; p < spec.params().size(); ++p)
      std::memcpy(dst.data() + p * numel * 2, tier.host_shard(p), numel * 2);
    if (r > 0) f.copy_s = std::min(f.copy_s, seconds_since(t0));
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::filesystem::temp_directory_path().string();
  bool quick = false;
  int io_threads = offload_config{}.nvme_io_threads;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--scratch" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--io-threads" && i + 1 < argc)
      io_threads = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: offload_tiers [--scratch DIR] [--io-threads N] [--quick]\n");
      return 2;
    }
  }
  const int scale = quick ? 1 : 4;
  try {
    const nvme_figures n = nvme_step(dir, 8 * scale, std::size_t{3} << 20, 3, io_threads);  // 24M (96M) parameters
    const upload_figures u = upload(16, std::size_t{8} << 20, quick ? 5 : 20);              // 256 MiB of bf16 shards
    const double gb = 1e9;
    std::printf("offload_tiers (scratch %s, %s)\n\n", dir.c_str(), n.direct ? "O_DIRECT" : "buffered I/O");
    std::printf("%-34s %10s %10s\n", "what", "seconds", "GB/s");
    std::printf("%-34s %10.3f %10.2f\n", "nvme step (read + write of state)", n.step_s,
                2.0 * double(n.bytes) / gb / n.step_s);
    std::printf("%-34s %10.3f %10s\n", "the same step, state in memory", n.memory_step_s, "");
    std::printf("%-34s %10.3f %10.2f\n", "disk sequential read", n.read_s, double(n.bytes) / gb / n.read_s);
    std::printf("%-34s %10.3f %10.2f\n", "disk sequential write", n.write_s, double(n.bytes) / gb / n.write_s);
    std::printf("%-34s %10.4f %10.2f\n", "parameter upload (stage + release)", u.upload_s,
                double(u.bytes) / gb / u.upload_s);
    std::printf("%-34s %10.4f %10.2f\n", "plain memcpy of the same bytes", u.copy_s, double(u.bytes) / gb / u.copy_s);
    std::printf("\nstate_bytes_per_step: %llu\n", static_cast<unsigned long long>(2 * n.bytes));
    std::printf("nvme_step_vs_memory_step: %.3f\n", n.memory_step_s / n.step_s);
    std::printf("nvme_step_vs_disk: %.3f\n", (n.read_s + n.write_s) / n.step_s);
    std::printf("param_upload_vs_copy: %.3f\n", u.copy_s / u.upload_s);
  } catch (const error& e) {
    std::fprintf(stderr, "offload_tiers: %s\n", e.what());
    return 1;
  }
  return 0;
}

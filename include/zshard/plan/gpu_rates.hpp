#pragma once
// The machine a fit is searched for (plan/fit_search.hpp): its shape (ranks per node, nodes),
// its capacities (device memory per rank, host memory and NVMe per node) and the rates the time
// model reads (plan/fit_time_model.hpp, docs/fit_time_model.md). Each GPU kind has documented
// defaults, each of which a user overrides (zshard_plan --fit --gemm-tflops ..., or the field).
//
// Where the defaults come from (per GPU unless said; GB/s are 1e9 bytes per second):
//   device_gib        the memory nvidia-smi reports (A100 80 GB: 81920 MiB; H100 SXM: 81559 MiB;
//                     H200: 143771 MiB; A100 40 GB: 40960 MiB; L40S: 46068 MiB).
//   gemm_tflops       dense 16-bit GEMM rate that large cuBLAS GEMMs sustain: about 80% of the
//                     datasheet's dense peak (A100 312, H100 SXM and H200 989, L40S 362 TFLOP/s).
//   compute_efficiency the share of that rate a whole training step of a transformer reaches
//                     (norms, attention softmax, launch gaps): 0.6, i.e. 45-50% model FLOPs
//                     utilisation, the range published Llama-class training runs report.
//   hbm_gbps          device memory bandwidth (datasheet): the on-device AdamW pass.
//   intra_node_gbps   ring bus bandwidth per rank inside a node (what nccl-tests calls busbw for
//                     all_gather / reduce_scatter at large sizes): NVLink 3 (A100) about 230,
//                     NVLink 4 (H100, H200) about 360; L40S has no NVLink: PCIe, about 20.
//   inter_node_gbps   ring bus bandwidth per rank across nodes, one NIC per GPU: HDR 200 Gb/s
//                     (A100 systems) about 22, NDR 400 Gb/s (H100, H200) about 45.
//   pcie_gbps         host <-> device per GPU, one direction, page-locked: Gen4 x16 about 25,
//                     Gen5 x16 about 50.
//   latency_us        a collective's fixed cost inside a node (the inter-node figure is 2x).
//   host_adam_gelems  zshard's host AdamW per rank in 1e9 elements/s: memory-bound at about 30
//                     bytes per element (bench/NOTES.md: 1.9 G/s on one core of a quiet VM);
//                     a node's memory bandwidth (~400 GB/s DDR4, ~600 GB/s DDR5) shared by its
//                     ranks gives about 1.5 (A100 systems) and 2.5 (H100 systems) per rank.
//   host_gib, nvme_gib, nvme_gbps   per node, a DGX of that GPU: DGX A100 (2 TiB host for the
//                     80 GB model, 1 TiB for the 40 GB; 15 TB NVMe at ~20 GB/s), DGX H100 /
//                     H200 (2 TiB; 30 TB NVMe at ~25 GB/s read and write together). L40S: a
//                     typical 8-GPU PCIe server (1 TiB, 7.68 TB at 12 GB/s).
// The `host` kind is this project's host backend: ranks are threads (or MPI processes) of a
// CPU, the device's memory is the host's, nothing overlaps (no role streams), and its rates are
// placeholders: measure them (zshard_plan --fit --gpu host --calibrate-host).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zshard::plan {

struct gpu_rates {
  std::string kind;         // "h100-sxm"
  std::string description;  // one line
  double device_gib = 0;
  double gemm_tflops = 0;
  double compute_efficiency = 0.6;
  double hbm_gbps = 0;
  double intra_node_gbps = 0;
  double inter_node_gbps = 0;
  double pcie_gbps = 0;
  double latency_us = 0;
  double host_adam_gelems = 0;
  double host_gib = 0;   // per node
  double nvme_gib = 0;   // per node; 0: no NVMe tier
  double nvme_gbps = 0;  // per node, reads and writes together
  bool streams = true;          // gathers and reductions overlap compute (CUDA role streams)
  bool device_is_host = false;  // the host backend: device memory is host memory

  double inter_latency_us() const noexcept { return 2 * latency_us; }
};

// The known kinds, in the order --help lists them.
inline const std::vector<gpu_rates>& gpu_kinds() {
  static const std::vector<gpu_rates> kinds = [] {
    std::vector<gpu_rates> k;
    gpu_rates a100{.kind = "a100-80g",
                   .description = "A100 SXM 80 GB, NVLink 3, HDR 200 Gb/s per GPU (DGX A100)",
                   .device_gib = 80.0,
                   .gemm_tflops = 250,
                   .hbm_gbps = 2039,
                   .intra_node_gbps = 230,
                   .inter_node_gbps = 22,
                   .pcie_gbps = 25,
                   .latency_us = 20,
                   .host_adam_gelems = 1.5,
                   .host_gib = 2048,
                   .nvme_gib = 13970,
                   .nvme_gbps = 20};
    k.push_back(a100);
    gpu_rates a100_40 = a100;
    a100_40.kind = "a100-40g";
    a100_40.description = "A100 SXM 40 GB, NVLink 3, HDR 200 Gb/s per GPU (DGX A100 320 GB)";
    a100_40.device_gib = 40.0;
    a100_40.hbm_gbps = 1555;
    a100_40.host_gib = 1024;
    k.push_back(a100_40);
    gpu_rates h100{.kind = "h100-sxm",
                   .description = "H100 SXM 80 GB, NVLink 4, NDR 400 Gb/s per GPU (DGX H100)",
                   .device_gib = 81559.0 / 1024,
                   .gemm_tflops = 790,
                   .hbm_gbps = 3350,
                   .intra_node_gbps = 360,
                   .inter_node_gbps = 45,
                   .pcie_gbps = 50,
                   .latency_us = 15,
                   .host_adam_gelems = 2.5,
                   .host_gib = 2048,
                   .nvme_gib = 27940,
                   .nvme_gbps = 25};
    k.push_back(h100);
    gpu_rates h200 = h100;
    h200.kind = "h200";
    h200.description = "H200 SXM 141 GB, NVLink 4, NDR 400 Gb/s per GPU (DGX H200)";
    h200.device_gib = 143771.0 / 1024;
    h200.hbm_gbps = 4800;
    k.push_back(h200);
    gpu_rates l40s{.kind = "l40s",
                   .description = "L40S 48 GB PCIe, no NVLink, 200 Gb/s per GPU",
                   .device_gib = 46068.0 / 1024,
                   .gemm_tflops = 290,
                   .hbm_gbps = 864,
                   .intra_node_gbps = 20,
                   .inter_node_gbps = 22,
                   .pcie_gbps = 25,
                   .latency_us = 25,
                   .host_adam_gelems = 1.5,
                   .host_gib = 1024,
                   .nvme_gib = 7150,
                   .nvme_gbps = 12};
    k.push_back(l40s);
    // The host backend: placeholders of a few-core VM, meant to be measured (--calibrate-host).
    gpu_rates host{.kind = "host",
                   .description = "this project's host backend (CPU; ranks are threads or processes)",
                   .device_gib = 0,  // the host's memory: host_gib, shared with the host ledger
                   .gemm_tflops = 0.03,
                   .compute_efficiency = 0.5,
                   .hbm_gbps = 10,
                   .intra_node_gbps = 5,
                   .inter_node_gbps = 1,
                   .pcie_gbps = 0,
                   .latency_us = 20,
                   .host_adam_gelems = 1.0,
                   .host_gib = 16,
                   .nvme_gib = 0,
                   .nvme_gbps = 1,
                   .streams = false,
                   .device_is_host = true};
    k.push_back(host);
    return k;
  }();
  return kinds;
}

inline std::optional<gpu_rates> gpu_kind_named(std::string_view name) {
  for (const auto& k : gpu_kinds())
    if (k.kind == name) return k;
  return std::nullopt;
}

// The kinds' names, for messages: "a100-80g, a100-40g, h100-sxm, h200, l40s, host".
inline std::string gpu_kind_names() {
  std::string s;
  for (const auto& k : gpu_kinds()) s += (s.empty() ? "" : ", ") + k.kind;
  return s;
}

// The machine: its shape, its capacities (from the GPU kind unless given) and its rates.
struct fit_machine {
  gpu_rates rates;
  int ranks_per_node = 8;
  int nodes = 1;

  int world() const noexcept { return ranks_per_node * nodes; }
  static constexpr double gib = double(std::size_t{1} << 30);
  std::size_t device_bytes() const noexcept { return std::size_t(rates.device_gib * gib); }
  std::size_t host_bytes_per_node() const noexcept { return std::size_t(rates.host_gib * gib); }
  std::size_t nvme_bytes_per_node() const noexcept { return std::size_t(rates.nvme_gib * gib); }
  bool has_nvme() const noexcept { return rates.nvme_gib > 0 && rates.nvme_gbps > 0; }
};

}  // namespace zshard::plan

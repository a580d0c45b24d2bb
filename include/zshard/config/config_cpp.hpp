#pragma once
// An engine_config as C++ source: designated initialisers of the members that differ from
// engine_config{}'s, in declaration order, ready to paste (zshard_plan --fit prints the chosen
// configuration this way). Members without a value to print (log, trace, param_groups) are
// left out; say them in code.
//
//   zshard::engine_config cfg{
//       .param_dtype = zshard::dtype::bf16,
//       .prefetch = {.max_live_numel = 1000000000, .prefetch_numel = 234881024},
//       ...
//   };
#include <charconv>
#include <cstddef>
#include <string>
#include <vector>

#include "zshard/engine/engine_config.hpp"

namespace zshard::config {

namespace detail {

inline std::string cpp_float(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s + "f";
}
inline std::string cpp_double(double x) {
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}
inline std::string cpp_bool(bool b) { return b ? "true" : "false"; }
inline std::string cpp_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}
inline std::string cpp_dtype(dtype t) { return "zshard::dtype::" + std::string(to_string(t)); }
inline std::string cpp_tier(offload_tier t) { return "zshard::offload_tier::" + std::string(to_string(t)); }

// ".name = value" entries of one aggregate, those that differ from the default.
struct fields {
  std::vector<std::string> items;
  template <class T>
  void add(const char* name, const T& value, const T& default_value, std::string text) {
    if (!(value == default_value)) items.push_back(std::string(".") + name + " = " + std::move(text));
  }
  void nested(const char* name, const fields& inner) {
    if (inner.items.empty()) return;
    std::string s = std::string(".") + name + " = {";
    for (std::size_t i = 0; i < inner.items.size(); ++i) s += (i ? ", " : "") + inner.items[i];
    items.push_back(s + "}");
  }
};

}  // namespace detail

// `c` as `zshard::engine_config <name>{...};` (one member per line, indented by `indent`).
inline std::string engine_config_cpp(const engine_config& c, const std::string& name = "cfg",
                                     const std::string& indent = "") {
  using detail::fields;
  const engine_config d{};
  fields top;
  top.add("param_dtype", c.param_dtype, d.param_dtype, detail::cpp_dtype(c.param_dtype));
  fields part;
  part.add("persistence_threshold_numel", c.partition.persistence_threshold_numel, d.partition.persistence_threshold_numel,
           std::to_string(c.partition.persistence_threshold_numel));
  part.add("shard_alignment_numel", c.partition.shard_alignment_numel, d.partition.shard_alignment_numel,
           std::to_string(c.partition.shard_alignment_numel));
  top.nested("partition", part);
  fields hyb;
  hyb.add("shard_group_size", c.hybrid.shard_group_size, d.hybrid.shard_group_size,
          std::to_string(c.hybrid.shard_group_size));
  hyb.add("ranks_per_node", c.hybrid.ranks_per_node, d.hybrid.ranks_per_node, std::to_string(c.hybrid.ranks_per_node));
  top.nested("hybrid", hyb);
  fields pre;
  pre.add("max_live_numel", c.prefetch.max_live_numel, d.prefetch.max_live_numel,
          std::to_string(c.prefetch.max_live_numel));
  pre.add("prefetch_numel", c.prefetch.prefetch_numel, d.prefetch.prefetch_numel,
          std::to_string(c.prefetch.prefetch_numel));
  pre.add("max_reuse_distance", c.prefetch.max_reuse_distance, d.prefetch.max_reuse_distance,
          std::to_string(c.prefetch.max_reuse_distance));
  pre.add("allow_oversized_module", c.prefetch.allow_oversized_module, d.prefetch.allow_oversized_module,
          detail::cpp_bool(c.prefetch.allow_oversized_module));
  top.nested("prefetch", pre);
  fields red;
  red.add("reduce_bucket_numel", c.reduce.reduce_bucket_numel, d.reduce.reduce_bucket_numel,
          std::to_string(c.reduce.reduce_bucket_numel));
  red.add("replicated_pack_numel", c.reduce.replicated_pack_numel, d.reduce.replicated_pack_numel,
          std::to_string(c.reduce.replicated_pack_numel));
  top.nested("reduce", red);
  fields adam;
  adam.add("lr", c.adamw.lr, d.adamw.lr, detail::cpp_float(c.adamw.lr));
  adam.add("beta1", c.adamw.beta1, d.adamw.beta1, detail::cpp_float(c.adamw.beta1));
  adam.add("beta2", c.adamw.beta2, d.adamw.beta2, detail::cpp_float(c.adamw.beta2));
  adam.add("eps", c.adamw.eps, d.adamw.eps, detail::cpp_float(c.adamw.eps));
  adam.add("weight_decay", c.adamw.weight_decay, d.adamw.weight_decay, detail::cpp_float(c.adamw.weight_decay));
  adam.add("update_params_without_grad", c.adamw.update_params_without_grad, d.adamw.update_params_without_grad,
           detail::cpp_bool(c.adamw.update_params_without_grad));
  top.nested("adamw", adam);
  top.add("clip_norm", c.clip_norm, d.clip_norm, detail::cpp_double(c.clip_norm));
  top.add("clip_norm_type", c.clip_norm_type, d.clip_norm_type, detail::cpp_double(c.clip_norm_type));
  fields ls;
  ls.add("enabled", c.loss_scale.enabled, d.loss_scale.enabled, detail::cpp_bool(c.loss_scale.enabled));
  ls.add("initial_scale", c.loss_scale.initial_scale, d.loss_scale.initial_scale,
         detail::cpp_float(c.loss_scale.initial_scale));
  ls.add("growth_factor", c.loss_scale.growth_factor, d.loss_scale.growth_factor,
         detail::cpp_float(c.loss_scale.growth_factor));
  ls.add("backoff_factor", c.loss_scale.backoff_factor, d.loss_scale.backoff_factor,
         detail::cpp_float(c.loss_scale.backoff_factor));
  ls.add("growth_interval", c.loss_scale.growth_interval, d.loss_scale.growth_interval,
         std::to_string(c.loss_scale.growth_interval));
  ls.add("min_scale", c.loss_scale.min_scale, d.loss_scale.min_scale, detail::cpp_float(c.loss_scale.min_scale));
  top.nested("loss_scale", ls);
  fields off;
  const auto& o = c.offload;
  const auto& od = d.offload;
  off.add("host_threads", o.host_threads, od.host_threads, std::to_string(o.host_threads));
  off.add("host_path", o.host_path, od.host_path, "zshard::optim::simd_path::" + std::string(optim::to_string(o.host_path)));
  off.add("host_tile_numel", o.host_tile_numel, od.host_tile_numel, std::to_string(o.host_tile_numel));
  off.add("host_staging_numel", o.host_staging_numel, od.host_staging_numel, std::to_string(o.host_staging_numel));
  off.add("host_budget_bytes", o.host_budget_bytes, od.host_budget_bytes,
          o.host_budget_bytes ? std::to_string(*o.host_budget_bytes) : std::string("std::nullopt"));
  off.add("pin_memory", o.pin_memory, od.pin_memory, detail::cpp_bool(o.pin_memory));
  off.add("params", o.params, od.params, detail::cpp_tier(o.params));
  off.add("optimizer_state", o.optimizer_state, od.optimizer_state, detail::cpp_tier(o.optimizer_state));
  off.add("nvme_path", o.nvme_path, od.nvme_path, detail::cpp_string(o.nvme_path));
  off.add("nvme_chunk_numel", o.nvme_chunk_numel, od.nvme_chunk_numel, std::to_string(o.nvme_chunk_numel));
  off.add("nvme_buffer_count", o.nvme_buffer_count, od.nvme_buffer_count, std::to_string(o.nvme_buffer_count));
  off.add("nvme_io_threads", o.nvme_io_threads, od.nvme_io_threads, std::to_string(o.nvme_io_threads));
  top.nested("offload", off);
  top.add("overlap", c.overlap, d.overlap, detail::cpp_bool(c.overlap));
  top.add("check_every_scope", c.check_every_scope, d.check_every_scope, detail::cpp_bool(c.check_every_scope));

  std::string s = indent + "zshard::engine_config " + name + "{\n";
  for (const auto& item : top.items) s += indent + "    " + item + ",\n";
  return s + indent + "};\n";
}

}  // namespace zshard::config

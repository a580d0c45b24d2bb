#pragma once
// Helpers for the GPU tests: device buffers for test data, host<->device round trips, and the
// toy model trained through the engine on cuda_backend + nccl_comm (its scopes hand out device
// pointers, so parameters are copied to the host around the toy model's host math).
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "../engine/equivalence_check.hpp"
#include "zshard/backend/cuda_backend.hpp"
#include "zshard/comm/nccl_ranks.hpp"
#include "zshard/offload/host_adam.hpp"

namespace gpu_test {

using zshard::dtype;

inline int device_count() { return zshard::cuda::count_devices().count; }

// The first n visible devices (n capped at what exists).
inline std::vector<int> devices(int n) {
  std::vector<int> d;
  for (int i = 0; i < std::min(n, device_count()); ++i) d.push_back(i);
  return d;
}

// Device copy of host data, as one ledgered buffer of the backend; `offset_elems` shifts the
// pointer off the allocation's alignment to exercise the kernels' unaligned paths.
template <class T>
struct device_array {
  zshard::buffer<zshard::cuda_backend> storage;
  T* ptr = nullptr;
  std::size_t n = 0;

  device_array(zshard::cuda_backend& b, const std::vector<T>& host, std::size_t offset_elems = 0)
      : storage(b, dtype::f32, (host.size() + offset_elems) * sizeof(T) / 4 + 1, zshard::mem_category::scratch),
        ptr(reinterpret_cast<T*>(storage.template as<unsigned char>() + offset_elems * sizeof(T))),
        n(host.size()) {
    b.copy(ptr, host.data(), n * sizeof(T), b.make_stream());
  }
  std::vector<T> to_host(zshard::cuda_backend& b) const {
    std::vector<T> out(n);
    b.copy(out.data(), ptr, n * sizeof(T), b.make_stream());
    b.synchronize(b.make_stream());
    return out;
  }
};

// ---- the toy model through the engine on GPUs ----------------------------------------------
template <class Engine>
std::vector<float> param_to_host(Engine& eng, const zshard::const_view& v) {
  std::vector<unsigned char> raw(v.bytes());
  auto s = eng.backend().make_stream();
  eng.backend().copy(raw.data(), v.data(), v.bytes(), s);
  eng.backend().synchronize(s);
  std::vector<float> out(v.numel());
  zshard::convert(raw.data(), v.type(), out.data(), dtype::f32, v.numel());
  return out;
}

// Runs fn(host gradient pointer) with a backward scope's k-th gradient brought to the host,
// then writes it back: the toy model accumulates (+=) into it.
template <class Engine, class Scope, class F>
void with_grad(Engine& eng, const Scope& g, std::size_t k, F&& fn) {
  const auto view = g.grad(k);
  std::vector<float> host(view.numel());
  auto s = eng.backend().make_stream();
  eng.backend().copy(host.data(), view.data(), view.bytes(), s);
  eng.backend().synchronize(s);
  fn(host.data());
  eng.backend().copy(view.data(), host.data(), view.bytes(), s);
  eng.backend().synchronize(s);
}

// toy::run_micro_batch with device parameters: forward, backward in reverse.
template <class Engine>
void run_micro_batch_on_device(Engine& eng, const toy::config& mc, const toy::ids& id, const toy::batch& b,
                               bool inject_inf) {
  const int D = mc.dim, V = mc.vocab;
  const auto seq = toy::layer_sequence(mc);
  std::vector<float> h;
  {
    auto g = eng.forward(id.embed);
    toy::embed_forward(param_to_host(eng, g.param(0)).data(), b.tokens, D, h);
  }
  std::vector<std::vector<float>> xs, ts;
  for (int l : seq) {
    auto g = eng.forward(id.layer[l]);
    const auto W = param_to_host(eng, g.param(0)), bias = param_to_host(eng, g.param(1));
    const auto s = l == 0 ? param_to_host(eng, g.param(2)) : std::vector<float>{};
    std::vector<float> t, y;
    toy::layer_forward(W.data(), bias.data(), s.empty() ? nullptr : s.data(), h, D, t, y);
    xs.push_back(h);
    ts.push_back(t);
    h = y;
  }
  std::vector<float> logits, dlogits, dh;
  {
    auto g = eng.forward(id.head);
    toy::head_forward(param_to_host(eng, g.param(0)).data(), param_to_host(eng, g.param(1)).data(), h, V, D, logits);
  }
  toy::cross_entropy(logits, b.targets, V, eng.loss_scale(), dlogits);
  eng.begin_backward();
  {
    auto g = eng.backward(id.head);
    const auto E = param_to_host(eng, g.param(0));
    with_grad(eng, g, 0, [&](float* dE) {
      with_grad(eng, g, 1, [&](float* dc) {
        toy::head_backward(E.data(), h, dlogits, V, D, dE, dc, dh);
        if (inject_inf) dc[0] = std::numeric_limits<float>::infinity();
      });
    });
  }
  for (std::size_t u = seq.size(); u-- > 0;) {
    const int l = seq[u];
    auto g = eng.backward(id.layer[l]);
    const auto W = param_to_host(eng, g.param(0));
    const auto s = l == 0 ? param_to_host(eng, g.param(2)) : std::vector<float>{};
    std::vector<float> dx;
    with_grad(eng, g, 0, [&](float* dW) {
      with_grad(eng, g, 1, [&](float* db) {
        toy::layer_backward(W.data(), s.empty() ? nullptr : s.data(), xs[u], ts[u], dh, D, dW, db, dx);
      });
    });
    dh = dx;
  }
  {
    auto g = eng.backward(id.embed);
    with_grad(eng, g, 0, [&](float* dE) { toy::embed_backward(b.tokens, D, dh, dE); });
  }
  eng.end_backward();
}

// toy::train_sharded on o.world GPUs (one thread and one NCCL rank per GPU). With
// separate_reduce, reductions run on a second communicator per rank (engine's reduce_comm).
template <class Policies = zshard::default_policies>
toy::train_result train_on_gpus(const toy::train_options& o, zshard::nccl_completion completion,
                                bool separate_reduce = false) {
  toy::train_result result;
  std::mutex mu;
  const auto devs = devices(o.world);
  REQUIRE(static_cast<int>(devs.size()) == o.world);
  zshard::nccl_options opts;
  opts.timeout = std::chrono::milliseconds(60'000);
  std::vector<zshard::nccl_comm> reduce_comms;
  if (separate_reduce) reduce_comms = zshard::nccl_comm::create_local(devs, opts);
  try {
    zshard::run_nccl_ranks(
        devs,
        [&](zshard::nccl_comm& comm) {
          toy::ids id;
          zshard::cuda_backend backend({.device = comm.device()});
          comm.set_completion(completion);
          zshard::nccl_comm& reduce = separate_reduce ? reduce_comms[static_cast<std::size_t>(comm.rank())] : comm;
          reduce.set_completion(completion);
          {
            zshard::engine<zshard::cuda_backend, zshard::nccl_comm, Policies> eng(
                backend, comm, reduce, toy::make_spec(o.model, id), o.engine);
            toy::train_rank(
                eng, comm.rank(), o,
                [&](const toy::batch& b, bool inject) { run_micro_batch_on_device(eng, o.model, id, b, inject); }, mu,
                result);
          }
          comm.synchronize();
        },
        opts);
  } catch (...) {
    for (auto& c : reduce_comms) c.abort("a rank failed");
    throw;
  }
  zshard::nccl_comm::finalize_all(reduce_comms);
  return result;
}

}  // namespace gpu_test

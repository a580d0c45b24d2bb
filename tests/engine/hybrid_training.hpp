#pragma once
// The toy model (toy_model.hpp: a tied embedding, a layer used twice, a frozen parameter,
// replicated small parameters) trained with activation checkpointing and a no-grad evaluation
// pass every step, on any communicator: what the hybrid-sharding tests run on threads and MPI.
#include <cstdint>
#include <mutex>
#include <vector>

#include "toy_training.hpp"

namespace toy {

// One micro-batch with every layer checkpointed: the forward keeps only each layer's input, the
// backward re-runs the layer's forward under recompute(m) and then its backward.
template <class Engine>
void run_checkpointed_micro_batch(Engine& eng, const config& mc, const ids& id, const batch& b) {
  const int D = mc.dim, V = mc.vocab;
  const auto seq = layer_sequence(mc);
  const forward_pass f = engine_forward(eng, mc, id, b, as_f32, zshard::use_kind::counted, /*checkpointed=*/true);
  std::vector<float> dlogits, dh;
  cross_entropy(f.logits, b.targets, V, eng.loss_scale(), dlogits);
  eng.begin_backward();
  {
    auto g = eng.backward(id.head);
    head_backward(as_f32(g.param(0)).data(), f.h, dlogits, V, D, g.grad_data(0), g.grad_data(1), dh);
  }
  for (std::size_t u = seq.size(); u-- > 0;) {
    const int l = seq[u];
    std::vector<float> t, y;
    {
      auto g = eng.recompute(id.layer[l]);
      const auto s = l == 0 ? as_f32(g.param(2)) : std::vector<float>{};
      layer_forward(as_f32(g.param(0)).data(), as_f32(g.param(1)).data(), s.empty() ? nullptr : s.data(),
                    f.xs[u], D, t, y);
    }
    auto g = eng.backward(id.layer[l]);
    const auto W = as_f32(g.param(0));
    const auto s = l == 0 ? as_f32(g.param(2)) : std::vector<float>{};
    std::vector<float> dx;
    layer_backward(W.data(), s.empty() ? nullptr : s.data(), f.xs[u], t, dh, D, g.grad_data(0), g.grad_data(1), dx);
    dh = dx;
  }
  {
    auto g = eng.backward(id.embed);
    embed_backward(b.tokens, D, dh, g.grad_data(0));
  }
  eng.end_backward();
}

// An evaluation pass: every module under use_kind::no_grad (never counted, no backward).
template <class Engine>
float run_no_grad_pass(Engine& eng, const config& mc, const ids& id, const batch& b) {
  const forward_pass f = engine_forward(eng, mc, id, b, as_f32, zshard::use_kind::no_grad);
  std::vector<float> dlogits;
  return cross_entropy(f.logits, b.targets, mc.vocab, 1.0f, dlogits);
}

// The per-rank loop: each step a no-grad pass on this rank's rows, then the checkpointed
// micro-batches. `rank` and o.world are the world's (data parallel over every rank).
template <class Engine>
void train_checkpointed_rank(Engine& eng, int rank, const train_options& o, std::mutex& mu, train_result& result,
                             std::vector<std::vector<std::vector<float>>>* every_rank = nullptr) {
  const ids id = ids_of(eng.spec(), o.model);
  int calls = 0;
  train_rank(
      eng, rank, o,
      [&](const batch& b, bool) {
        if (calls++ % o.micro_batches == 0) (void)run_no_grad_pass(eng, o.model, id, b);  // once per step
        run_checkpointed_micro_batch(eng, o.model, id, b);
      },
      mu, result);
  if (every_rank) {
    auto params = all_params(eng);
    std::lock_guard lock(mu);
    (*every_rank)[static_cast<std::size_t>(rank)] = std::move(params);
  }
}

}  // namespace toy

#pragma once
// Training the toy model two ways: sharded through the engine on thread ranks, and as a
// single-process float64 reference on the same global batches. Tests compare the two.
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "toy_model.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"

namespace toy {

struct train_options {
  int world = 2;
  int micro_batches = 1;   // per step, per rank
  int rows = 3;            // samples per micro-batch per rank
  int steps = 4;
  int overflow_step = -1;  // inject an Inf gradient on the last rank in this step (0-based)
  config model{};
  zshard::engine_config engine{};
};

struct train_result {
  std::vector<std::vector<float>> params;  // full values of every parameter after training
  std::vector<zshard::step_report> reports;
  std::size_t peak_gathered_bytes = 0, peak_grad_bucket_bytes = 0;
};

inline std::vector<float> as_f32(const zshard::const_view& v) {
  std::vector<float> out(v.numel());
  zshard::convert(v.data(), v.type(), out.data(), zshard::dtype::f32, v.numel());
  return out;
}

inline batch slice(const batch& global, int begin, int n) {
  batch b;
  b.tokens.assign(global.tokens.begin() + begin, global.tokens.begin() + begin + n);
  b.targets.assign(global.targets.begin() + begin, global.targets.begin() + begin + n);
  return b;
}

// What one micro-batch's forward leaves for its backward.
struct forward_pass {
  std::vector<float> h;                    // the last layer's output: the head's input
  std::vector<std::vector<float>> xs, ts;  // each layer use's input and pre-activation (ts: not when checkpointed)
  std::vector<float> logits;
};

// One micro-batch's forward through the engine, every use its own scope of `kind`; read(view)
// brings a gathered parameter to the host as floats (as_f32 on the host backend). Checkpointed:
// each layer's pre-activation is dropped, to be recomputed in backward.
template <class Engine, class Read>
forward_pass engine_forward(Engine& eng, const config& mc, const ids& id, const batch& b, Read&& read,
                            zshard::use_kind kind = zshard::use_kind::counted, bool checkpointed = false) {
  const int D = mc.dim, V = mc.vocab;
  forward_pass f;
  {
    auto g = eng.forward(id.embed, kind);
    embed_forward(read(g.param(0)).data(), b.tokens, D, f.h);
  }
  for (int l : layer_sequence(mc)) {
    auto g = eng.forward(id.layer[l], kind);
    const auto W = read(g.param(0)), bias = read(g.param(1));
    const auto s = l == 0 ? read(g.param(2)) : std::vector<float>{};
    std::vector<float> t, y;
    layer_forward(W.data(), bias.data(), s.empty() ? nullptr : s.data(), f.h, D, t, y);
    f.xs.push_back(f.h);
    if (!checkpointed) f.ts.push_back(std::move(t));
    f.h = std::move(y);
  }
  {
    auto g = eng.forward(id.head, kind);
    head_forward(read(g.param(0)).data(), read(g.param(1)).data(), f.h, V, D, f.logits);
  }
  return f;
}

// One micro-batch through the engine: forward, backward in reverse, every use its own scope.
template <class Engine>
float run_micro_batch(Engine& eng, const config& mc, const ids& id, const batch& b, bool inject_inf) {
  const int D = mc.dim, V = mc.vocab;
  const auto seq = layer_sequence(mc);
  const forward_pass f = engine_forward(eng, mc, id, b, as_f32);
  std::vector<float> dlogits, dh;
  const float loss = cross_entropy(f.logits, b.targets, V, eng.loss_scale(), dlogits);
  eng.begin_backward();
  {
    auto g = eng.backward(id.head);
    head_backward(as_f32(g.param(0)).data(), f.h, dlogits, V, D, g.grad_data(0), g.grad_data(1), dh);
    if (inject_inf) g.grad_data(1)[0] = std::numeric_limits<float>::infinity();
  }
  for (std::size_t u = seq.size(); u-- > 0;) {
    const int l = seq[u];
    auto g = eng.backward(id.layer[l]);
    const auto W = as_f32(g.param(0));
    const auto s = l == 0 ? as_f32(g.param(2)) : std::vector<float>{};
    std::vector<float> dx;
    layer_backward(W.data(), s.empty() ? nullptr : s.data(), f.xs[u], f.ts[u], dh, D, g.grad_data(0), g.grad_data(1),
                   dx);
    dh = dx;
  }
  {
    auto g = eng.backward(id.embed);
    embed_backward(b.tokens, D, dh, g.grad_data(0));
  }
  eng.end_backward();
  return loss;
}

// Every parameter's full value (a collective: every rank calls it).
template <class Engine>
std::vector<std::vector<float>> all_params(Engine& eng) {
  std::vector<std::vector<float>> out;
  for (zshard::param_id p : eng.spec().param_ids()) out.push_back(eng.gather_param(p));
  return out;
}

// After training: rank 0 records the parameters, its step reports and ledger peaks in `result`.
template <class Engine>
void keep_result(Engine& eng, int rank, std::vector<zshard::step_report> reports, std::mutex& mu,
                 train_result& result) {
  auto params = all_params(eng);
  if (rank != 0) return;
  std::lock_guard lock(mu);
  result.params = std::move(params);
  result.reports = std::move(reports);
  result.peak_gathered_bytes = eng.ledger().peak(zshard::mem_category::gathered_params);
  result.peak_grad_bucket_bytes = eng.ledger().peak(zshard::mem_category::grad_buckets);
}

// The per-rank loop every backend shares: o.steps steps of o.micro_batches micro-batches, this
// rank's rows of each global batch, an Inf injected where o.overflow_step says; then rank 0
// records the parameters, step reports and ledger peaks in `result`.
template <class Engine, class RunMicroBatch>
void train_rank(Engine& eng, int rank, const train_options& o, RunMicroBatch&& run_one, std::mutex& mu,
                train_result& result) {
  const int per_step = o.world * o.micro_batches * o.rows;
  std::vector<zshard::step_report> reports;
  for (int step = 0; step < o.steps; ++step) {
    const batch global = make_batch(o.model.vocab, std::uint64_t(step), per_step);
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      const batch local = slice(global, (mb * o.world + rank) * o.rows, o.rows);
      run_one(local, step == o.overflow_step && rank == o.world - 1 && mb == 0);
    }
    reports.push_back(eng.step());
  }
  keep_result(eng, rank, std::move(reports), mu, result);
}

// Trains the toy model on o.world thread ranks, each with its own Backend; then on every rank
// after(engine, backend, rank) reads what a test needs besides the result (rank 0's reducer,
// ledgers), while the engine is still alive.
inline constexpr auto nothing_after = [](auto&, auto&, int) {};
template <class Policies = zshard::default_policies, class Backend = zshard::host_backend,
          class After = decltype(nothing_after)>
train_result train_sharded(const train_options& o, After after = {}) {
  train_result result;
  std::mutex mu;
  zshard::run_ranks(o.world, [&](zshard::thread_comm& comm) {
    ids id;
    Backend backend;
    zshard::engine<Backend, zshard::thread_comm, Policies> eng(backend, comm, make_spec(o.model, id), o.engine);
    train_rank(
        eng, comm.rank(), o, [&](const batch& b, bool inject) { run_micro_batch(eng, o.model, id, b, inject); }, mu,
        result);
    after(eng, backend, comm.rank());
  });
  return result;
}

// fn(eng, id, comm) on `world` thread ranks, each with an engine (Policies, the default config)
// of the default toy model: where a test of the engine's calls, not of its training, starts.
template <class Policies = zshard::default_policies, class Fn>
void on_toy_engines(int world, Fn&& fn) {
  zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
    ids id;
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm, Policies> eng(backend, comm, make_spec({}, id), {});
    fn(eng, static_cast<const ids&>(id), comm);
  });
}

// ---- the float64 single-process reference ---------------------------------------------------
inline double round_to(double x, zshard::dtype t) {
  const float f = static_cast<float>(x);
  switch (t) {
    case zshard::dtype::f32: return f;
    case zshard::dtype::bf16: return zshard::to_float(zshard::to_bf16(f));
    case zshard::dtype::f16: return zshard::to_float(zshard::to_f16(f));
  }
  return f;
}

// The float64 gradient of the mean loss over `global` at the working values `w` (by parameter),
// added to `grad`: one pass over the whole batch, as a single process would train.
inline void reference_grads(const config& mc, const ids& id, const std::vector<std::vector<double>>& w,
                            const batch& global, std::vector<std::vector<double>>& grad) {
  const int D = mc.dim, V = mc.vocab;
  const auto seq = layer_sequence(mc);
  std::vector<double> h, logits, dlogits, dh;
  embed_forward(w[id.E].data(), global.tokens, D, h);
  std::vector<std::vector<double>> xs, ts;
  for (int l : seq) {
    std::vector<double> t, y;
    layer_forward(w[id.W[l]].data(), w[id.b[l]].data(), l == 0 ? w[id.s[0]].data() : nullptr, h, D, t, y);
    xs.push_back(h);
    ts.push_back(t);
    h = y;
  }
  head_forward(w[id.E].data(), w[id.c].data(), h, V, D, logits);
  cross_entropy(logits, global.targets, V, 1.0, dlogits);
  head_backward(w[id.E].data(), h, dlogits, V, D, grad[id.E].data(), grad[id.c].data(), dh);
  for (std::size_t u = seq.size(); u-- > 0;) {
    const int l = seq[u];
    std::vector<double> dx;
    layer_backward(w[id.W[l]].data(), l == 0 ? w[id.s[0]].data() : nullptr, xs[u], ts[u], dh, D, grad[id.W[l]].data(),
                   grad[id.b[l]].data(), dx);
    dh = dx;
  }
  embed_backward(global.tokens, D, dh, grad[id.E].data());
}

inline train_result train_reference(const train_options& o) {
  ids id;
  const zshard::model_spec spec = make_spec(o.model, id);
  const auto& ps = spec.params();
  const std::size_t P = ps.size();
  std::vector<std::vector<double>> master(P), m(P), v(P), grad(P);
  for (std::size_t p = 0; p < P; ++p) {
    for (std::size_t i = 0; i < ps[p].numel(); ++i) master[p].push_back(ps[p].init(std::int64_t(i)));
    m[p].assign(master[p].size(), 0.0);
    v[p].assign(master[p].size(), 0.0);
  }
  const auto& a = o.engine.adamw;
  std::int64_t t = 0;
  train_result result;
  for (int step = 0; step < o.steps; ++step) {
    // working values: the master rounded to the working dtype, as the engine's shards are
    std::vector<std::vector<double>> w(P);
    for (std::size_t p = 0; p < P; ++p) {
      const auto type = ps[p].type.value_or(o.engine.param_dtype);
      for (double x : master[p]) w[p].push_back(round_to(x, type));
      grad[p].assign(master[p].size(), 0.0);
    }
    // the mean over the global batch equals the mean of per-(rank, micro-batch) means
    reference_grads(o.model, id, w, make_batch(o.model.vocab, std::uint64_t(step), o.world * o.micro_batches * o.rows),
                    grad);
    zshard::step_report r;
    if (step == o.overflow_step) {
      r.skipped = true;
    } else {
      double sq = 0;
      for (std::size_t p = 0; p < P; ++p)
        if (ps[p].trainable)
          for (double g : grad[p]) sq += g * g;
      r.grad_norm = std::sqrt(sq);
      r.clip_coefficient = o.engine.clip_norm > 0 ? std::min(1.0, o.engine.clip_norm / (r.grad_norm + 1e-6)) : 1.0;
      ++t;
      const double bc1 = 1 - std::pow(double(a.beta1), double(t)), bc2 = 1 - std::pow(double(a.beta2), double(t));
      for (std::size_t p = 0; p < P; ++p) {
        if (!ps[p].trainable) continue;
        const double wd = ps[p].decay ? a.weight_decay : 0.0;
        for (std::size_t i = 0; i < master[p].size(); ++i) {
          const double g = grad[p][i] * r.clip_coefficient;
          m[p][i] = a.beta1 * m[p][i] + (1 - a.beta1) * g;
          v[p][i] = a.beta2 * v[p][i] + (1 - a.beta2) * g * g;
          master[p][i] *= 1 - double(a.lr) * wd;
          master[p][i] -= a.lr * (m[p][i] / bc1) / (std::sqrt(v[p][i] / bc2) + a.eps);
        }
      }
    }
    r.step = t;
    result.reports.push_back(r);
  }
  for (std::size_t p = 0; p < P; ++p) {
    const auto type = ps[p].type.value_or(o.engine.param_dtype);
    std::vector<float> out;
    for (double x : master[p]) out.push_back(float(round_to(x, type)));
    result.params.push_back(out);
  }
  return result;
}

}  // namespace toy

#pragma once
// The toy model (toy_model.hpp) trained with what a training stack changes between steps and
// micro-batches — learning rates per parameter group, freezing and unfreezing, gradient sync
// off for all but the last micro-batch, modules kept gathered until their backward, clipping
// by norm type 2, 1 or inf — twice: sharded through the engine on thread ranks, and as an
// independent float64 single-process reference that applies the same schedule with its own
// AdamW. Tests compare the two (toy::check_equal).
#include <cmath>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "equivalence_check.hpp"
#include "zshard/offload/host_adam.hpp"

namespace feat {

using toy::batch;
using toy::ids;

struct plan {
  toy::train_options base = toy::base_options(2);
  // Before step s's first forward: (parameter name, trainable) and (group, lr) changes.
  std::multimap<int, std::pair<std::string, bool>> trainable_at;
  std::multimap<int, std::pair<std::string, float>> lr_at;
  // Before step s, before its trainability changes: (parameter name, full value) that the last
  // rank writes with write_param (frozen or not; the reference takes it as the master).
  std::multimap<int, std::pair<std::string, std::vector<float>>> value_at;
  bool no_sync = false;                    // gradient sync on the last micro-batch of a step only
  std::vector<std::string> keep_gathered;  // modules kept gathered from forward to backward
  std::vector<std::string> frozen_at_start;
};

inline zshard::model_spec make_spec(const plan& pl, ids& id) {
  auto spec = toy::make_spec(pl.base.model, id);
  for (const auto& n : pl.frozen_at_start) spec.set_trainable(spec.param_by_name(n), false);
  return spec;
}

// One micro-batch; gradients of frozen parameters are dropped, as a stack would skip them.
template <class Engine>
void run_micro_batch(Engine& eng, const toy::config& mc, const ids& id, const batch& b) {
  const int D = mc.dim, V = mc.vocab;
  const auto seq = toy::layer_sequence(mc);
  auto add = [&](auto& g, std::size_t k, const std::vector<float>& d) {
    if (!eng.spec().param(eng.spec().module(g.module()).params[k]).trainable) return;
    float* out = g.grad_data(k);
    for (std::size_t i = 0; i < d.size(); ++i) out[i] += d[i];
  };
  const toy::forward_pass f = toy::engine_forward(eng, mc, id, b, toy::as_f32);
  std::vector<float> dlogits, dh;
  toy::cross_entropy(f.logits, b.targets, V, eng.loss_scale(), dlogits);
  eng.begin_backward();
  {
    auto g = eng.backward(id.head);
    std::vector<float> dE(std::size_t(V) * D, 0.0f), dc(V, 0.0f);
    toy::head_backward(toy::as_f32(g.param(0)).data(), f.h, dlogits, V, D, dE.data(), dc.data(), dh);
    add(g, 0, dE);
    add(g, 1, dc);
  }
  for (std::size_t u = seq.size(); u-- > 0;) {
    const int l = seq[u];
    auto g = eng.backward(id.layer[l]);
    const auto W = toy::as_f32(g.param(0));
    const auto s = l == 0 ? toy::as_f32(g.param(2)) : std::vector<float>{};
    std::vector<float> dW(std::size_t(D) * D, 0.0f), db(D, 0.0f), dx;
    toy::layer_backward(W.data(), s.empty() ? nullptr : s.data(), f.xs[u], f.ts[u], dh, D, dW.data(), db.data(), dx);
    add(g, 0, dW);
    add(g, 1, db);
    dh = dx;
  }
  {
    auto g = eng.backward(id.embed);
    std::vector<float> dE(std::size_t(V) * D, 0.0f);
    toy::embed_backward(b.tokens, D, dh, dE.data());
    add(g, 0, dE);
  }
  eng.end_backward();
}

// The schedule's changes before step s, on this rank's engine.
template <class Engine>
void apply_changes(Engine& eng, const plan& pl, int s) {
  const int writer = eng.world_comm().size() - 1;
  for (auto [it, end] = pl.value_at.equal_range(s); it != end; ++it)
    eng.write_param(
        eng.spec().param_by_name(it->second.first),
        eng.world_comm().rank() == writer ? std::span<const float>(it->second.second) : std::span<const float>{},
        writer);
  for (auto [it, end] = pl.trainable_at.equal_range(s); it != end; ++it)
    eng.set_trainable(eng.spec().param_by_name(it->second.first), it->second.second);
  for (auto [it, end] = pl.lr_at.equal_range(s); it != end; ++it) eng.set_lr(it->second.first, it->second.second);
}

template <class Policies = zshard::default_policies>
toy::train_result train_sharded(const plan& pl) {
  const auto& o = pl.base;
  toy::train_result result;
  std::mutex mu;
  zshard::run_ranks(o.world, [&](zshard::thread_comm& comm) {
    ids id;
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm, Policies> eng(backend, comm, make_spec(pl, id), o.engine);
    for (const auto& m : pl.keep_gathered) eng.set_keep_gathered_until_backward(eng.spec().module_by_name(m), true);
    const int rank = comm.rank(), per_step = o.world * o.micro_batches * o.rows;
    std::vector<zshard::step_report> reports;
    for (int step = 0; step < o.steps; ++step) {
      apply_changes(eng, pl, step);
      const batch global = toy::make_batch(o.model.vocab, std::uint64_t(step), per_step);
      for (int mb = 0; mb < o.micro_batches; ++mb) {
        if (pl.no_sync) eng.set_gradient_sync(mb + 1 == o.micro_batches);
        run_micro_batch(eng, o.model, id, toy::slice(global, (mb * o.world + rank) * o.rows, o.rows));
      }
      reports.push_back(eng.step());
    }
    toy::keep_result(eng, rank, std::move(reports), mu, result);
  });
  return result;
}

// ---- the float64 reference ------------------------------------------------------------------
struct reference_model {
  std::vector<std::vector<double>> master, m, v;
  std::vector<double> lr, wd;  // per parameter, resolved from the groups here (not by the engine)
  std::vector<bool> trainable;
  std::vector<std::int64_t> updates;  // per parameter: AdamW updates applied (its bias correction), as torch.optim
};

// A group claims the parameters it names or matches; the rest keep adamw's values.
template <class Group>
bool claims(const Group& g, const zshard::param_spec& p) {
  bool in = g.match && g.match(p);
  for (const auto& n : g.params) in = in || n == p.name;
  return in;
}

// Each parameter's state, learning rate and weight decay. Decay off (decay = false) means no
// weight decay whatever the group says.
inline reference_model reference_init(const plan& pl, const zshard::model_spec& spec) {
  const auto& ps = spec.params();
  const auto& a = pl.base.engine.adamw;
  reference_model r;
  for (std::size_t p = 0; p < ps.size(); ++p) {
    std::vector<double> x;
    for (std::size_t i = 0; i < ps[p].numel(); ++i) x.push_back(ps[p].init(std::int64_t(i)));
    r.master.push_back(x);
    r.m.emplace_back(x.size(), 0.0);
    r.v.emplace_back(x.size(), 0.0);
    double lr = a.lr, wd = a.weight_decay;
    for (const auto& g : pl.base.engine.param_groups) {
      if (claims(g, ps[p])) {
        lr = g.lr.value_or(a.lr);
        wd = g.weight_decay.value_or(a.weight_decay);
      }
    }
    r.lr.push_back(lr);
    r.wd.push_back(ps[p].decay ? wd : 0.0);
    r.trainable.push_back(ps[p].trainable);
    r.updates.push_back(0);
  }
  return r;
}

// From the state r (reference_init's, or one a test wrote into).
inline toy::train_result train_reference(const plan& pl, reference_model r) {
  const auto& o = pl.base;
  ids id;
  const zshard::model_spec spec = make_spec(pl, id);
  const auto& ps = spec.params();
  const std::size_t P = ps.size();
  // group name -> its parameters, for the lr schedule
  auto in_group = [&](const std::string& group, std::size_t p) {
    if (group == "default") {
      for (const auto& g : o.engine.param_groups)
        if (claims(g, ps[p])) return false;
      return true;
    }
    for (const auto& g : o.engine.param_groups)
      if (g.name == group) return claims(g, ps[p]);
    return false;
  };
  const auto& a = o.engine.adamw;
  std::int64_t t = 0;
  toy::train_result result;
  for (int step = 0; step < o.steps; ++step) {
    for (auto [it, end] = pl.value_at.equal_range(step); it != end; ++it) {
      auto& x = r.master[spec.param_by_name(it->second.first)];
      x.assign(it->second.second.begin(), it->second.second.end());  // m, v and the update count stay
    }
    for (auto [it, end] = pl.trainable_at.equal_range(step); it != end; ++it)
      r.trainable[spec.param_by_name(it->second.first)] = it->second.second;
    for (auto [it, end] = pl.lr_at.equal_range(step); it != end; ++it)
      for (std::size_t p = 0; p < P; ++p)
        if (in_group(it->second.first, p)) r.lr[p] = it->second.second;
    std::vector<std::vector<double>> w(P), grad(P);
    for (std::size_t p = 0; p < P; ++p) {
      for (double x : r.master[p]) w[p].push_back(toy::round_to(x, ps[p].type.value_or(o.engine.param_dtype)));
      grad[p].assign(r.master[p].size(), 0.0);
    }
    toy::reference_grads(o.model, id, w,
                         toy::make_batch(o.model.vocab, std::uint64_t(step), o.world * o.micro_batches * o.rows), grad);
    // clip_grad_norm_ over the trainable parameters, of norm type 2, 1 or inf
    const double type = o.engine.clip_norm_type;
    double acc = 0;
    for (std::size_t p = 0; p < P; ++p)
      if (r.trainable[p])
        for (double g : grad[p])
          acc = type == 2 ? acc + g * g : type == 1 ? acc + std::abs(g) : std::max(acc, std::abs(g));
    zshard::step_report rep;
    rep.grad_norm = type == 2 ? std::sqrt(acc) : acc;
    rep.clip_coefficient = o.engine.clip_norm > 0 ? std::min(1.0, o.engine.clip_norm / (rep.grad_norm + 1e-6)) : 1.0;
    ++t;
    for (std::size_t p = 0; p < P; ++p) {
      // A frozen parameter is skipped and its own update count stays; one unfrozen for the first
      // time starts at 0 (its state is created then): torch.optim's per-parameter state['step'].
      if (!r.trainable[p]) continue;
      const double n = double(++r.updates[p]);
      const double bc1 = 1 - std::pow(double(a.beta1), n), bc2 = 1 - std::pow(double(a.beta2), n);
      for (std::size_t i = 0; i < r.master[p].size(); ++i) {
        const double g = grad[p][i] * rep.clip_coefficient;
        r.m[p][i] = a.beta1 * r.m[p][i] + (1 - a.beta1) * g;
        r.v[p][i] = a.beta2 * r.v[p][i] + (1 - a.beta2) * g * g;
        r.master[p][i] *= 1 - double(float(r.lr[p])) * r.wd[p];
        r.master[p][i] -= double(float(r.lr[p])) * (r.m[p][i] / bc1) / (std::sqrt(r.v[p][i] / bc2) + a.eps);
      }
    }
    rep.step = t;
    result.reports.push_back(rep);
  }
  for (std::size_t p = 0; p < P; ++p) {
    std::vector<float> out;
    for (double x : r.master[p]) out.push_back(float(toy::round_to(x, ps[p].type.value_or(o.engine.param_dtype))));
    result.params.push_back(out);
  }
  return result;
}

inline toy::train_result train_reference(const plan& pl) {
  ids id;
  return train_reference(pl, reference_init(pl, make_spec(pl, id)));
}

}  // namespace feat

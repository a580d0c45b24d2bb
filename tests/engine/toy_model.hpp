#pragma once
// A small model for engine tests, with the features the engine must get right: a weight tied
// between the first and last module (shared parameter), a module used twice per step (loop),
// a frozen parameter, small parameters (replicated under a persistence threshold) and sizes
// that do not divide evenly by 3 or 8 ranks.
//
//   embed:   h = E[tokens]                         E [V, D]
//   layer_i: h = tanh(h W_i + b_i) * s_i            W_i [D, D], b_i [D], s_i [D] frozen (layer 0)
//            layer 1 runs twice when `repeat_layer1`
//   head:    logits = h E^T + c                     E tied, c [V]
//   loss:    mean cross-entropy
//
// The math is plain loops over float (or double for references) so that this file is an
// independent reference, not a reuse of the engine.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "zshard/model/model_spec.hpp"

namespace toy {

struct config {
  int vocab = 13;
  int dim = 8;
  int layers = 3;
  bool repeat_layer1 = true;
  std::string name;  // the model_spec's name, for messages (empty: unnamed)
};

// Module ids are registration order: embed, layer0..layerL-1, head.
struct ids {
  zshard::param_id E, c;
  std::vector<zshard::param_id> W, b, s;
  zshard::module_id embed, head;
  std::vector<zshard::module_id> layer;
};

// `id` receives the new spec's ids (bound to it: they work on that spec and its copies, an
// engine's included, and are refused by any other spec, even one built by this function).
inline zshard::model_spec make_spec(const config& cfg, ids& id) {
  id = {};
  zshard::model_spec spec(cfg.name);
  id.E = spec.add_param("E", {cfg.vocab, cfg.dim}, {.init = zshard::init::normal(0, 0.5f, 11)});
  id.c = spec.add_param("c", {cfg.vocab}, {.decay = false, .init = zshard::init::uniform(-0.1f, 0.1f, 12)});
  for (int l = 0; l < cfg.layers; ++l) {
    const auto L = std::to_string(l);
    id.W.push_back(spec.add_param("W" + L, {cfg.dim, cfg.dim}, {.init = zshard::init::normal(0, 0.4f, 20 + l)}));
    id.b.push_back(
        spec.add_param("b" + L, {cfg.dim}, {.decay = false, .init = zshard::init::uniform(-0.1f, 0.1f, 40 + l)}));
  }
  id.s.push_back(spec.add_param("s0", {cfg.dim}, {.trainable = false, .init = zshard::init::uniform(0.8f, 1.2f, 60)}));
  id.embed = spec.add_module("embed", {id.E});
  for (int l = 0; l < cfg.layers; ++l) {
    std::vector<zshard::param_id> ps = {id.W[l], id.b[l]};
    if (l == 0) ps.push_back(id.s[0]);
    id.layer.push_back(spec.add_module("layer" + std::to_string(l), ps));
  }
  id.head = spec.add_module("head", {id.E, id.c});
  return spec;
}

// The ids of a spec make_spec built (an engine's copy, say), looked up by name.
inline ids ids_of(const zshard::model_spec& spec, const config& cfg) {
  ids id;
  id.E = spec.param_by_name("E");
  id.c = spec.param_by_name("c");
  for (int l = 0; l < cfg.layers; ++l) {
    const auto L = std::to_string(l);
    id.W.push_back(spec.param_by_name("W" + L));
    id.b.push_back(spec.param_by_name("b" + L));
  }
  id.s.push_back(spec.param_by_name("s0"));
  id.embed = spec.module_by_name("embed");
  for (int l = 0; l < cfg.layers; ++l) id.layer.push_back(spec.module_by_name("layer" + std::to_string(l)));
  id.head = spec.module_by_name("head");
  return id;
}

// The sequence of layer uses in a forward pass (layer 1 twice when repeated).
inline std::vector<int> layer_sequence(const config& cfg) {
  std::vector<int> seq;
  for (int l = 0; l < cfg.layers; ++l) {
    seq.push_back(l);
    if (l == 1 && cfg.repeat_layer1) seq.push_back(l);
  }
  return seq;
}

struct batch {
  std::vector<int> tokens, targets;
};

// Global batch `step` of `n` samples; deterministic, so every rank can slice it.
inline batch make_batch(int vocab, std::uint64_t step, int n) {
  std::mt19937_64 rng(1000 + step);
  batch b;
  for (int i = 0; i < n; ++i) {
    const int t = int(rng() % std::uint64_t(vocab));
    b.tokens.push_back(t);
    b.targets.push_back((t * 5 + 3 + int(rng() % 2)) % vocab);  // learnable with a little noise
  }
  return b;
}

// ---- the math, on plain arrays ------------------------------------------------------------
template <class T>
void embed_forward(const T* E, const std::vector<int>& tokens, int D, std::vector<T>& h) {
  h.assign(tokens.size() * D, T(0));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (int d = 0; d < D; ++d) h[i * D + d] = E[tokens[i] * D + d];
}
template <class T>
void embed_backward(const std::vector<int>& tokens, int D, const std::vector<T>& dh, T* dE) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (int d = 0; d < D; ++d) dE[tokens[i] * D + d] += dh[i * D + d];
}

// y = tanh(x W + b) * s (s may be null); keeps tanh output for backward.
template <class T>
void layer_forward(const T* W, const T* b, const T* s, const std::vector<T>& x, int D, std::vector<T>& t,
                   std::vector<T>& y) {
  const std::size_t B = x.size() / D;
  t.assign(B * D, T(0));
  y.assign(B * D, T(0));
  for (std::size_t i = 0; i < B; ++i)
    for (int o = 0; o < D; ++o) {
      T z = b[o];
      for (int k = 0; k < D; ++k) z += x[i * D + k] * W[k * D + o];
      t[i * D + o] = std::tanh(z);
      y[i * D + o] = t[i * D + o] * (s ? s[o] : T(1));
    }
}
template <class T>
void layer_backward(const T* W, const T* s, const std::vector<T>& x, const std::vector<T>& t, const std::vector<T>& dy,
                    int D, T* dW, T* db, std::vector<T>& dx) {
  const std::size_t B = x.size() / D;
  dx.assign(B * D, T(0));
  for (std::size_t i = 0; i < B; ++i)
    for (int o = 0; o < D; ++o) {
      const T dz = dy[i * D + o] * (s ? s[o] : T(1)) * (T(1) - t[i * D + o] * t[i * D + o]);
      db[o] += dz;
      for (int k = 0; k < D; ++k) {
        dW[k * D + o] += x[i * D + k] * dz;
        dx[i * D + k] += W[k * D + o] * dz;
      }
    }
}

template <class T>
void head_forward(const T* E, const T* c, const std::vector<T>& h, int V, int D, std::vector<T>& logits) {
  const std::size_t B = h.size() / D;
  logits.assign(B * V, T(0));
  for (std::size_t i = 0; i < B; ++i)
    for (int v = 0; v < V; ++v) {
      T z = c[v];
      for (int d = 0; d < D; ++d) z += h[i * D + d] * E[v * D + d];
      logits[i * V + v] = z;
    }
}
template <class T>
void head_backward(const T* E, const std::vector<T>& h, const std::vector<T>& dlogits, int V, int D, T* dE, T* dc,
                   std::vector<T>& dh) {
  const std::size_t B = h.size() / D;
  dh.assign(B * D, T(0));
  for (std::size_t i = 0; i < B; ++i)
    for (int v = 0; v < V; ++v) {
      const T g = dlogits[i * V + v];
      dc[v] += g;
      for (int d = 0; d < D; ++d) {
        dE[v * D + d] += g * h[i * D + d];
        dh[i * D + d] += g * E[v * D + d];
      }
    }
}

// Mean cross-entropy over the rows; dlogits = scale * d(mean loss)/d(logits).
template <class T>
T cross_entropy(const std::vector<T>& logits, const std::vector<int>& targets, int V, T scale,
                std::vector<T>& dlogits) {
  const std::size_t B = targets.size();
  dlogits.assign(B * V, T(0));
  T loss = 0;
  for (std::size_t i = 0; i < B; ++i) {
    T mx = logits[i * V];
    for (int v = 1; v < V; ++v) mx = std::max(mx, logits[i * V + v]);
    T sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(logits[i * V + v] - mx);
    loss += std::log(sum) + mx - logits[i * V + targets[i]];
    for (int v = 0; v < V; ++v) {
      const T p = std::exp(logits[i * V + v] - mx) / sum;
      dlogits[i * V + v] = scale * (p - (v == targets[i] ? T(1) : T(0))) / T(B);
    }
  }
  return loss / T(B);
}

}  // namespace toy

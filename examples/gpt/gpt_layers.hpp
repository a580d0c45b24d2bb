#pragma once
// Building blocks of the GPT example: layer norm, linear, GELU and causal self-attention,
// each a forward and a backward over row-major Eigen matrices (one row per token).
// Parameters arrive as raw pointers (the engine's gathered buffers) and are wrapped in
// Eigen::Map; backward ACCUMULATES into parameter gradients (+=) because a parameter may
// receive several contributions per step, but ASSIGNS input gradients.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "eigen.hpp"

namespace gpt {

using index = Eigen::Index;

template <class S>
using mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using col_vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S>
using row_vec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

// Read-only activation input: binds a mat, a Map or a row block without copying.
// type_identity keeps it out of template deduction (S comes from the cache argument).
template <class S>
using in_mat = std::type_identity_t<Eigen::Ref<const mat<S>>>;

namespace layers {

template <class S>
using cmat_map = Eigen::Map<const mat<S>>;
template <class S>
using mat_map = Eigen::Map<mat<S>>;
template <class S>
using crow_map = Eigen::Map<const row_vec<S>>;
template <class S>
using row_map = Eigen::Map<row_vec<S>>;

inline constexpr double layer_norm_eps = 1e-5;

// Normalised rows and their reciprocal std: all the backward needs (the affine output is
// cheap to rebuild, so it is not kept).
template <class S>
void layer_norm_stats(in_mat<S> x, mat<S>& xhat, col_vec<S>& rstd) {
  const index n = x.rows(), d = x.cols();
  xhat.resize(n, d);
  rstd.resize(n);
  for (index i = 0; i < n; ++i) {
    const S mean = x.row(i).mean();
    xhat.row(i).array() = x.row(i).array() - mean;
    const S var = xhat.row(i).squaredNorm() / static_cast<S>(d);
    const S r = S(1) / std::sqrt(var + static_cast<S>(layer_norm_eps));
    rstd(i) = r;
    xhat.row(i) *= r;
  }
}

template <class S>
void layer_norm_apply(const mat<S>& xhat, const S* gain, const S* bias, mat<S>& y) {
  crow_map<S> g(gain, xhat.cols()), b(bias, xhat.cols());
  y.resize(xhat.rows(), xhat.cols());
  y.array() = (xhat.array().rowwise() * g.array()).rowwise() + b.array();
}

// dx += d(layer_norm)/dx . dy (adds, so the residual branch can pre-load dx).
template <class S>
void layer_norm_backward(const mat<S>& dy, const mat<S>& xhat, const col_vec<S>& rstd,
                         const S* gain, S* dgain, S* dbias, mat<S>& dx) {
  const index n = xhat.rows(), d = xhat.cols();
  crow_map<S> g(gain, d);
  row_map<S> dg(dgain, d), db(dbias, d);
  dg.array() += (dy.array() * xhat.array()).colwise().sum();
  db += dy.colwise().sum();
  for (index i = 0; i < n; ++i) {
    const auto dxhat = dy.row(i).array() * g.array();  // an expression: no temporary row
    const S mean_dxhat = dxhat.mean();
    const S mean_dxhat_xhat = (dxhat * xhat.row(i).array()).mean();
    dx.row(i).array() += rstd(i) * (dxhat - mean_dxhat - xhat.row(i).array() * mean_dxhat_xhat);
  }
}

// y = x W + b, W [in, out] row-major; bias may be null.
template <class S>
void linear_forward(in_mat<S> x, const S* weight, const S* bias, index out_cols, mat<S>& y) {
  cmat_map<S> w(weight, x.cols(), out_cols);
  y.resize(x.rows(), out_cols);
  y.noalias() = x * w;
  if (bias) y.rowwise() += crow_map<S>(bias, out_cols);
}

// dW += x^T dy, db += colsum(dy), dx = dy W^T. dbias may be null (no bias).
template <class S>
void linear_backward(in_mat<S> x, in_mat<S> dy, const S* weight, S* dweight, S* dbias, mat<S>& dx) {
  const index in = x.cols(), out = dy.cols();
  cmat_map<S> w(weight, in, out);
  mat_map<S> dw(dweight, in, out);
  dw.noalias() += x.transpose() * dy;
  if (dbias) row_map<S>(dbias, out) += dy.colwise().sum();
  dx.resize(dy.rows(), in);
  dx.noalias() = dy * w.transpose();
}

// GELU, tanh approximation (GPT-2).
template <class S>
struct gelu_constants {
  static constexpr S c = static_cast<S>(0.7978845608028654);  // sqrt(2/pi)
  static constexpr S a = static_cast<S>(0.044715);
};

// Written through the logistic function, 0.5 (1 + tanh z) = sigma(2z): with
// E = exp(-2z) (its argument capped at 80 so E stays finite), sigma = 1 / (1 + E) and
// 1 - sigma = E sigma, both without cancellation, so
//   gelu(x) = x sigma,   gelu'(x) = sigma + 2 sigma (1 - sigma) z'(x) x
// stays within a few ulp of the float64 closed form even where tanh saturates (1 - tanh^2
// would cancel there). One vectorised exp and one division per element, no branch (Eigen 3.4
// does not vectorise select()). Both passes run over fixed-size chunks on the stack, so
// nothing [N, d_ff]-sized is allocated per call; the scalar std::tanh loop this replaces was
// about 20% of a training step's CPU.
inline constexpr index gelu_chunk = 256;

template <class S>
using gelu_array = Eigen::Array<S, Eigen::Dynamic, 1>;

namespace detail {
// sigma(2 z(x)) into sig and 1 - sigma into sig_c, for one chunk x.
template <class S, class X, class A>
void gelu_sigmoid(const X& x, A&& sig, A&& sig_c) {
  using k = gelu_constants<S>;
  sig_c = (S(-2) * k::c * (x + k::a * x.cube())).min(S(80)).exp();  // E
  sig = (S(1) + sig_c).inverse();
  sig_c *= sig;
}

// Calls f(begin, x, sig, sig_c) for each chunk of u's elements from `begin` (x: the chunk,
// sig and sig_c: gelu_sigmoid's terms for it).
template <class S, class F>
void for_gelu_chunks(const mat<S>& u, F&& f) {
  const index n = u.size();
  Eigen::Array<S, gelu_chunk, 1> sig, sig_c;
  for (index b = 0; b < n; b += gelu_chunk) {
    const index len = std::min(gelu_chunk, n - b);
    Eigen::Map<const gelu_array<S>> x(u.data() + b, len);
    gelu_sigmoid<S>(x, sig.head(len), sig_c.head(len));
    f(b, x, sig.head(len), sig_c.head(len));
  }
}
}  // namespace detail

template <class S>
void gelu_forward(const mat<S>& u, mat<S>& y) {
  y.resize(u.rows(), u.cols());
  detail::for_gelu_chunks(u, [&](index b, const auto& x, const auto& sig, const auto&) {
    Eigen::Map<gelu_array<S>>(y.data() + b, x.size()) = x * sig;
  });
}

// du = du * gelu'(u), in place (du arrives holding dy).
template <class S>
void gelu_backward(const mat<S>& u, mat<S>& du) {
  using k = gelu_constants<S>;
  detail::for_gelu_chunks(u, [&](index b, const auto& x, const auto& s, const auto& sc) {
    Eigen::Map<gelu_array<S>>(du.data() + b, x.size()) *=
        s + S(2) * k::c * s * sc * (S(1) + S(3) * k::a * x.square()) * x;
  });
}

// Causal multi-head self-attention core (no projections).
// qkv [B*T, 3d] holds q | k | v, head h in columns [h*hd, (h+1)*hd) of each third.
// att [B*H*T, T]: softmax probabilities per (b, h), kept for the backward.
// out [B*T, d]: heads concatenated.
template <class S>
void causal_attention_forward(const mat<S>& qkv, int batch, int seq, int heads, mat<S>& att,
                              mat<S>& out) {
  const index t_len = seq, d = qkv.cols() / 3, hd = d / heads;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  att.resize(static_cast<index>(batch) * heads * t_len, t_len);
  out.resize(qkv.rows(), d);
  for (index b = 0; b < batch; ++b) {
    for (index h = 0; h < heads; ++h) {
      const auto q = qkv.block(b * t_len, h * hd, t_len, hd);
      const auto k = qkv.block(b * t_len, d + h * hd, t_len, hd);
      const auto v = qkv.block(b * t_len, 2 * d + h * hd, t_len, hd);
      auto p = att.block((b * heads + h) * t_len, 0, t_len, t_len);
      p.noalias() = q * k.transpose();
      for (index i = 0; i < t_len; ++i) {
        auto seen = p.row(i).head(i + 1);  // causal: token i attends to 0..i
        const S m = seen.maxCoeff();
        seen.array() = ((seen.array() - m) * scale).exp();
        seen /= seen.sum();
        p.row(i).tail(t_len - i - 1).setZero();
      }
      out.block(b * t_len, h * hd, t_len, hd).noalias() = p * v;
    }
  }
}

// dqkv = d(attention)/dqkv . dout (assigned). dp is a [T, T] scratch.
template <class S>
void causal_attention_backward(const mat<S>& qkv, const mat<S>& att, const mat<S>& dout, int batch,
                               int seq, int heads, mat<S>& dqkv, mat<S>& dp) {
  const index t_len = seq, d = qkv.cols() / 3, hd = d / heads;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  dqkv.resize(qkv.rows(), qkv.cols());
  dp.resize(t_len, t_len);
  for (index b = 0; b < batch; ++b) {
    for (index h = 0; h < heads; ++h) {
      const auto q = qkv.block(b * t_len, h * hd, t_len, hd);
      const auto k = qkv.block(b * t_len, d + h * hd, t_len, hd);
      const auto v = qkv.block(b * t_len, 2 * d + h * hd, t_len, hd);
      const auto p = att.block((b * heads + h) * t_len, 0, t_len, t_len);
      const auto dout_h = dout.block(b * t_len, h * hd, t_len, hd);
      dp.noalias() = dout_h * v.transpose();
      dqkv.block(b * t_len, 2 * d + h * hd, t_len, hd).noalias() = p.transpose() * dout_h;
      // Softmax backward: ds = p * (dp - <p, dp>) per row, times the score scale. Masked
      // entries have p = 0, so they get no gradient without a separate mask.
      for (index i = 0; i < t_len; ++i) {
        const S dot = p.row(i).dot(dp.row(i));
        dp.row(i).array() = p.row(i).array() * (dp.row(i).array() - dot) * scale;
      }
      dqkv.block(b * t_len, h * hd, t_len, hd).noalias() = dp * k;
      dqkv.block(b * t_len, d + h * hd, t_len, hd).noalias() = dp.transpose() * q;
    }
  }
}

}  // namespace layers
}  // namespace gpt

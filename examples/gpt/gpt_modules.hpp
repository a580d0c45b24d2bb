#pragma once
// The GPT example's modules as the engine sees them: embed, block, head and loss, each a
// forward that fills a cache and a backward that consumes it. Recompute under activation
// checkpointing is calling forward again on the same input: it rewrites the cache with the
// same values, so a block's cache can be one object reused by every layer.
//
// Parameters come through P, the "param access" the engine implements:
//   const S* P::param(int k) const   element 0 of parameter k (describe()'s order), row-major
//   S*       P::grad(int k)          a gradient buffer of the same shape; backward ADDS to it
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "gpt_config.hpp"
#include "gpt_layers.hpp"

namespace gpt {

template <class P, class S>
concept param_reader = requires(const P& p, int k) {
  { p.param(k) } -> std::convertible_to<const S*>;
};

// P may be a reference type (backward takes P&&, so engine scopes can be temporaries); a
// const one does not qualify, since backward must write gradients.
template <class P, class S>
concept param_writer = param_reader<std::remove_cvref_t<P>, S> &&
    requires(std::remove_reference_t<P>& p, int k) {
  { p.grad(k) } -> std::convertible_to<S*>;
};

namespace detail {
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}
template <class M>
std::size_t bytes_of(const M& m) noexcept {
  return static_cast<std::size_t>(m.size()) * sizeof(typename M::Scalar);
}
inline void check_shape(index rows, index cols, index want_rows, index want_cols,
                        const char* what) {
  require(rows == want_rows && cols == want_cols,
          std::string(what) + ": expected [" + std::to_string(want_rows) + ", " +
              std::to_string(want_cols) + "], got [" + std::to_string(rows) + ", " +
              std::to_string(cols) + "]");
}
inline void check_batch(const gpt_config& c, int batch, int seq, const char* what) {
  require(batch >= 1 && seq >= 1 && seq <= c.seq_len,
          std::string(what) + ": need B >= 1 and 1 <= T <= seq_len (" + std::to_string(c.seq_len) +
              "), got B=" + std::to_string(batch) + " T=" + std::to_string(seq));
}
}  // namespace detail

// ---- embed: x[b*T + t] = token[tokens[b, t]] + position[t] ---------------------------------

template <class S>
struct embed_cache {
  int batch = 0, seq = 0;
  std::vector<int32_t> tokens;  // the only thing backward needs: which rows to scatter into
  std::size_t saved_bytes() const noexcept { return tokens.size() * sizeof(int32_t); }
};

template <class S, param_reader<S> P>
void embed_forward(const gpt_config& c, const P& p, std::span<const int32_t> tokens, int batch,
                   int seq, embed_cache<S>& cache, mat<S>& x) {
  detail::check_batch(c, batch, seq, "embed_forward");
  const index n = static_cast<index>(batch) * seq, d = c.d_model;
  detail::require(static_cast<index>(tokens.size()) == n,
                  "embed_forward: tokens has " + std::to_string(tokens.size()) +
                      " entries, expected B*T = " + std::to_string(n));
  layers::cmat_map<S> wte(p.param(embed_param::token), c.vocab, d);
  layers::cmat_map<S> wpe(p.param(embed_param::position), c.seq_len, d);
  cache.batch = batch;
  cache.seq = seq;
  cache.tokens.assign(tokens.begin(), tokens.end());
  x.resize(n, d);
  for (index r = 0; r < n; ++r) {
    const int32_t tok = tokens[static_cast<std::size_t>(r)];
    if (tok < 0 || tok >= c.vocab)
      throw std::out_of_range("embed_forward: token " + std::to_string(tok) + " at " +
                              std::to_string(r) + " outside vocab " + std::to_string(c.vocab));
    x.row(r) = wte.row(tok) + wpe.row(r % seq);
  }
}

template <class S, param_reader<S> P>
mat<S> embed_forward(const gpt_config& c, const P& p, std::span<const int32_t> tokens, int batch,
                     int seq, embed_cache<S>& cache) {
  mat<S> x;
  embed_forward(c, p, tokens, batch, seq, cache, x);
  return x;
}

template <class S, param_writer<S> P>
void embed_backward(const gpt_config& c, P&& p, const embed_cache<S>& cache, in_mat<S> dx) {
  const index n = static_cast<index>(cache.batch) * cache.seq, d = c.d_model;
  detail::check_shape(dx.rows(), dx.cols(), n, d, "embed_backward: dx");
  layers::mat_map<S> dwte(p.grad(embed_param::token), c.vocab, d);
  layers::mat_map<S> dwpe(p.grad(embed_param::position), c.seq_len, d);
  for (index r = 0; r < n; ++r) {
    dwte.row(cache.tokens[static_cast<std::size_t>(r)]) += dx.row(r);
    dwpe.row(r % cache.seq) += dx.row(r);
  }
}

// ---- block: y = x + attn(ln1(x)); y += mlp(ln2(y)) (pre-LN) ---------------------------------

template <class S>
struct block_cache {
  int batch = 0, seq = 0;
  // Saved from forward for backward (what activation memory means for a block).
  mat<S> xhat1;      // [N, d]  normalised input of ln1
  col_vec<S> rstd1;  // [N]
  mat<S> qkv;        // [N, 3d]
  mat<S> att;        // [B*H*T, T] attention probabilities
  mat<S> attn_out;   // [N, d]  heads concatenated, input of the attention projection
  mat<S> xhat2;      // [N, d]  normalised input of ln2
  col_vec<S> rstd2;  // [N]
  mat<S> fc_pre;     // [N, d_ff] MLP pre-activation (GELU output is rebuilt in backward)
  // Scratch: meaningful only inside one call; kept here so steps do not reallocate.
  struct scratch_t {
    mat<S> h, x2, act, dres, dh, dact, dqkv, dp;
  } scratch;

  std::size_t saved_bytes() const noexcept {
    using detail::bytes_of;
    return bytes_of(xhat1) + bytes_of(rstd1) + bytes_of(qkv) + bytes_of(att) + bytes_of(attn_out) +
           bytes_of(xhat2) + bytes_of(rstd2) + bytes_of(fc_pre);
  }
  std::size_t scratch_bytes() const noexcept {
    using detail::bytes_of;
    const auto& s = scratch;
    return bytes_of(s.h) + bytes_of(s.x2) + bytes_of(s.act) + bytes_of(s.dres) + bytes_of(s.dh) +
           bytes_of(s.dact) + bytes_of(s.dqkv) + bytes_of(s.dp);
  }
};

// Bytes a block's cache saves between forward and backward for a [B, T] batch, known before
// anything runs (for the memory ledger / planner). Equals block_cache::saved_bytes() after a
// forward of that shape.
template <class S>
std::size_t block_activation_bytes(const gpt_config& c, int batch, int seq) noexcept {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq);
  const std::size_t d = static_cast<std::size_t>(c.d_model);
  const std::size_t att = static_cast<std::size_t>(batch) * static_cast<std::size_t>(c.n_heads) *
                          static_cast<std::size_t>(seq) * static_cast<std::size_t>(seq);
  const std::size_t elems = n * d                                    // xhat1
                            + n                                      // rstd1
                            + 3 * n * d                              // qkv
                            + att                                    // att
                            + n * d                                  // attn_out
                            + n * d + n                              // xhat2, rstd2
                            + n * static_cast<std::size_t>(c.d_ff);  // fc_pre
  return elems * sizeof(S);
}

// y may alias x (in-place residual stream): x is last read before y is first written.
template <class S, param_reader<S> P>
void block_forward(const gpt_config& c, const P& p, in_mat<S> x, int batch, int seq,
                   block_cache<S>& cache, mat<S>& y) {
  namespace bp = block_param;
  detail::check_batch(c, batch, seq, "block_forward");
  detail::check_shape(x.rows(), x.cols(), static_cast<index>(batch) * seq, c.d_model,
                      "block_forward: x");
  const index d = c.d_model, f = c.d_ff;
  auto& s = cache.scratch;
  cache.batch = batch;
  cache.seq = seq;

  layers::layer_norm_stats<S>(x, cache.xhat1, cache.rstd1);
  layers::layer_norm_apply<S>(cache.xhat1, p.param(bp::ln1_gain), p.param(bp::ln1_bias), s.h);
  layers::linear_forward<S>(s.h, p.param(bp::qkv_weight), p.param(bp::qkv_bias), 3 * d, cache.qkv);
  layers::causal_attention_forward<S>(cache.qkv, batch, seq, c.n_heads, cache.att, cache.attn_out);
  layers::linear_forward<S>(cache.attn_out, p.param(bp::attn_proj_weight),
                            p.param(bp::attn_proj_bias), d, s.x2);
  s.x2 += x;

  layers::layer_norm_stats<S>(s.x2, cache.xhat2, cache.rstd2);
  layers::layer_norm_apply<S>(cache.xhat2, p.param(bp::ln2_gain), p.param(bp::ln2_bias), s.h);
  layers::linear_forward<S>(s.h, p.param(bp::fc_weight), p.param(bp::fc_bias), f, cache.fc_pre);
  layers::gelu_forward<S>(cache.fc_pre, s.act);
  layers::linear_forward<S>(s.act, p.param(bp::mlp_proj_weight), p.param(bp::mlp_proj_bias), d, y);
  y += s.x2;
}

template <class S, param_reader<S> P>
mat<S> block_forward(const gpt_config& c, const P& p, in_mat<S> x, int batch, int seq,
                     block_cache<S>& cache) {
  mat<S> y;
  block_forward(c, p, x, batch, seq, cache, y);
  return y;
}

// dx may alias dy: dy is copied into scratch before dx is written.
template <class S, param_writer<S> P>
void block_backward(const gpt_config& c, P&& p, block_cache<S>& cache, in_mat<S> dy, mat<S>& dx) {
  namespace bp = block_param;
  const int batch = cache.batch, seq = cache.seq;
  detail::require(batch > 0, "block_backward: cache is empty (run block_forward first)");
  detail::check_shape(dy.rows(), dy.cols(), static_cast<index>(batch) * seq, c.d_model,
                      "block_backward: dy");
  auto& s = cache.scratch;
  s.dres = dy;  // gradient of the residual stream, grows as each branch adds its share

  // MLP branch: y = x2 + proj(gelu(fc(ln2(x2)))).
  layers::gelu_forward<S>(cache.fc_pre, s.act);
  layers::linear_backward<S>(s.act, s.dres, p.param(bp::mlp_proj_weight),
                             p.grad(bp::mlp_proj_weight), p.grad(bp::mlp_proj_bias), s.dact);
  layers::gelu_backward<S>(cache.fc_pre, s.dact);
  layers::layer_norm_apply<S>(cache.xhat2, p.param(bp::ln2_gain), p.param(bp::ln2_bias), s.h);
  layers::linear_backward<S>(s.h, s.dact, p.param(bp::fc_weight), p.grad(bp::fc_weight),
                             p.grad(bp::fc_bias), s.dh);
  layers::layer_norm_backward<S>(s.dh, cache.xhat2, cache.rstd2, p.param(bp::ln2_gain),
                                 p.grad(bp::ln2_gain), p.grad(bp::ln2_bias), s.dres);

  // Attention branch: x2 = x + proj(attention(qkv(ln1(x)))).
  layers::linear_backward<S>(cache.attn_out, s.dres, p.param(bp::attn_proj_weight),
                             p.grad(bp::attn_proj_weight), p.grad(bp::attn_proj_bias), s.dh);
  layers::causal_attention_backward<S>(cache.qkv, cache.att, s.dh, batch, seq, c.n_heads, s.dqkv,
                                       s.dp);
  layers::layer_norm_apply<S>(cache.xhat1, p.param(bp::ln1_gain), p.param(bp::ln1_bias), s.h);
  layers::linear_backward<S>(s.h, s.dqkv, p.param(bp::qkv_weight), p.grad(bp::qkv_weight),
                             p.grad(bp::qkv_bias), s.dh);
  dx = s.dres;
  layers::layer_norm_backward<S>(s.dh, cache.xhat1, cache.rstd1, p.param(bp::ln1_gain),
                                 p.grad(bp::ln1_gain), p.grad(bp::ln1_bias), dx);
}

// ---- head: logits = ln(x) W (no bias) ------------------------------------------------------

template <class S>
struct head_cache {
  int rows = 0;
  mat<S> xhat;
  col_vec<S> rstd;
  struct scratch_t {
    mat<S> h, dh;
  } scratch;
  std::size_t saved_bytes() const noexcept {
    return detail::bytes_of(xhat) + detail::bytes_of(rstd);
  }
};

template <class S, param_reader<S> P>
void head_forward(const gpt_config& c, const P& p, in_mat<S> x, head_cache<S>& cache,
                  mat<S>& logits) {
  detail::require(x.cols() == c.d_model && x.rows() > 0,
                  "head_forward: x must be [N, d_model=" + std::to_string(c.d_model) + "]");
  cache.rows = static_cast<int>(x.rows());
  layers::layer_norm_stats<S>(x, cache.xhat, cache.rstd);
  layers::layer_norm_apply<S>(cache.xhat, p.param(head_param::ln_gain),
                              p.param(head_param::ln_bias), cache.scratch.h);
  layers::linear_forward<S>(cache.scratch.h, p.param(head_param::weight), nullptr, c.vocab, logits);
}

template <class S, param_reader<S> P>
mat<S> head_forward(const gpt_config& c, const P& p, in_mat<S> x, head_cache<S>& cache) {
  mat<S> logits;
  head_forward(c, p, x, cache, logits);
  return logits;
}

template <class S, param_writer<S> P>
void head_backward(const gpt_config& c, P&& p, head_cache<S>& cache, in_mat<S> dlogits,
                   mat<S>& dx) {
  detail::require(cache.rows > 0, "head_backward: cache is empty (run head_forward first)");
  detail::check_shape(dlogits.rows(), dlogits.cols(), cache.rows, c.vocab,
                      "head_backward: dlogits");
  auto& s = cache.scratch;
  layers::layer_norm_apply<S>(cache.xhat, p.param(head_param::ln_gain),
                              p.param(head_param::ln_bias), s.h);
  layers::linear_backward<S>(s.h, dlogits, p.param(head_param::weight), p.grad(head_param::weight),
                             nullptr, s.dh);
  dx.setZero(cache.rows, c.d_model);
  layers::layer_norm_backward<S>(s.dh, cache.xhat, cache.rstd, p.param(head_param::ln_gain),
                                 p.grad(head_param::ln_gain), p.grad(head_param::ln_bias), dx);
}

// ---- loss: mean over tokens of -log softmax(logits)[target] ---------------------------------

template <class S>
struct cross_entropy_cache {
  mat<S> probs;  // softmax(logits): the gradient is probs - onehot
  std::vector<int32_t> targets;
  std::size_t saved_bytes() const noexcept {
    return detail::bytes_of(probs) + targets.size() * sizeof(int32_t);
  }
};

// Returns the mean loss (accumulated in double so a float model still reports it precisely).
template <class S>
double cross_entropy_forward(in_mat<S> logits, std::span<const int32_t> targets,
                             cross_entropy_cache<S>& cache) {
  const index n = logits.rows(), v = logits.cols();
  detail::require(n > 0 && static_cast<index>(targets.size()) == n,
                  "cross_entropy_forward: " + std::to_string(targets.size()) + " targets for " +
                      std::to_string(n) + " rows of logits");
  cache.targets.assign(targets.begin(), targets.end());
  cache.probs.resize(n, v);
  double total = 0.0;
  for (index i = 0; i < n; ++i) {
    const int32_t t = targets[static_cast<std::size_t>(i)];
    if (t < 0 || t >= v)
      throw std::out_of_range("cross_entropy_forward: target " + std::to_string(t) + " at " +
                              std::to_string(i) + " outside vocab " + std::to_string(v));
    const S m = logits.row(i).maxCoeff();  // shift so exp cannot overflow
    cache.probs.row(i).array() = (logits.row(i).array() - m).exp();
    const S sum = cache.probs.row(i).sum();
    cache.probs.row(i) /= sum;
    total += static_cast<double>(std::log(sum) + m - logits(i, t));
  }
  return total / static_cast<double>(n);
}

// dlogits = scale * d(mean loss)/dlogits (assigned). scale lets the trainer average over
// micro-batches or apply a loss scale without another pass. dlogits may alias the logits.
template <class S>
void cross_entropy_backward(const cross_entropy_cache<S>& cache, mat<S>& dlogits,
                            std::type_identity_t<S> scale = S(1)) {
  const index n = cache.probs.rows();
  detail::require(n > 0, "cross_entropy_backward: cache is empty (run the forward first)");
  const S w = scale / static_cast<S>(n);
  dlogits = cache.probs * w;
  for (index i = 0; i < n; ++i) dlogits(i, cache.targets[static_cast<std::size_t>(i)]) -= w;
}

template <class S>
mat<S> cross_entropy_backward(const cross_entropy_cache<S>& cache,
                              std::type_identity_t<S> scale = S(1)) {
  mat<S> dlogits;
  cross_entropy_backward(cache, dlogits, scale);
  return dlogits;
}

}  // namespace gpt

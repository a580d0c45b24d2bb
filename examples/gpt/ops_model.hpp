#pragma once
// The example GPT written once over an Ops (ops_contract.hpp), for the host (host_ops.hpp) and
// the GPU (cuda/cuda_ops.hpp): the same modules, parameters and math as gpt_modules.hpp, in
// mixed precision: matmul operands (activations and weights) in Ops::half_t, matmul results,
// the residual stream, layer norm, softmax and the loss in f32. With half_t = float it is the
// Eigen model's f32 arithmetic (up to the order of additions), which the CPU tests use to
// check every step of it.
//
// Memory: one arena from the Ops, sized before anything runs (arena_bytes: what the runner
// reports to the engine as activations). Each block keeps, between its forward and backward,
// what its backward reads (layer norm statistics, the matmul inputs, the attention's output and
// per-row log-sum-exp, the MLP pre-activation, the residual after attention); with activation
// checkpointing one such cache serves every block and only each block's input is kept. The rest
// is scratch shared by all blocks. Attention is fused (attention_math.hpp): its [T, T] scores
// and probabilities never reach the arena, so every buffer grows with the rows B x T only. Parameters come through P (param(k): const half_t*, grad(k): float*,
// gradients accumulate), as in gpt_modules.hpp.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "corpus.hpp"
#include "gpt_config.hpp"
#include "gpt_math.hpp"
#include "ops_contract.hpp"
#include "token_chunks.hpp"

namespace gpt {

template <class Ops>
class ops_gpt {
 public:
  using half_t = typename Ops::half_t;

  // Where each buffer sits in the arena (byte offsets, 256-byte aligned), for one shape.
  struct layout {
    struct cache_at {
      std::size_t mean1, rstd1, h1, qkv_h, attn, lse, x2, mean2, rstd2, h2, fc_pre;
    };
    std::vector<std::size_t> acts;  // f32 [N, d] per block input, then the head's input
    std::vector<cache_at> caches;   // one per block, or one shared with checkpointing
    std::size_t qkv, proj, mlp, act;                                             // forward scratch
    std::size_t dres, dres_h, dact, dfc_h, dh, datt, d_o, delta, dqkv, dqkv_h;  // backward
    std::size_t meanf, rstdf, hf, logits, dlogits, row_loss;                // head and loss
    // The batch's indices, one region uploaded at once (token_chunks.hpp), then the scratches.
    std::size_t tokens, targets, by_row, chunk_begin, chunk_token, chunk_slot, multi_token, multi_slot, batch_end;
    std::size_t token_partial, col_scratch;
    std::size_t total = 0;

    layout(const gpt_config& c, int batch, int seq, bool checkpoint) {
      const std::size_t n = std::size_t(batch) * std::size_t(seq), d = std::size_t(c.d_model),
                        f = std::size_t(c.d_ff), v = std::size_t(c.vocab), heads = std::size_t(c.n_heads);
      const std::size_t hs = sizeof(half_t), fs = sizeof(float), is = sizeof(std::int32_t);
      auto take = [&](std::size_t bytes) {
        const std::size_t at = total;
        total += (bytes + 255) / 256 * 256;
        return at;
      };
      for (int l = 0; l <= c.n_layers; ++l) acts.push_back(take(n * d * fs));
      caches.resize(checkpoint ? 1 : std::size_t(c.n_layers));
      for (auto& k : caches)
        k = {take(n * fs), take(n * fs), take(n * d * hs), take(3 * n * d * hs), take(n * d * hs), take(n * heads * fs),
             take(n * d * fs), take(n * fs), take(n * fs), take(n * d * hs), take(n * f * fs)};
      qkv = take(3 * n * d * fs), proj = take(n * d * fs), mlp = take(n * d * fs), act = take(n * f * hs);
      dres = take(n * d * fs), dres_h = take(n * d * hs), dact = take(n * f * fs), dfc_h = take(n * f * hs);
      dh = take(n * d * fs), datt = take(n * d * fs), d_o = take(n * d * hs), delta = take(n * heads * fs);
      dqkv = take(3 * n * d * fs), dqkv_h = take(3 * n * d * hs);
      meanf = take(n * fs), rstdf = take(n * fs), hf = take(n * d * hs), logits = take(n * v * fs);
      dlogits = take(n * v * hs), row_loss = take(n * fs);
      const std::size_t multi = n / ops::embed_rows_per_chunk + 1;  // tokens with more rows than a chunk
      tokens = take(n * is), targets = take(n * is), by_row = take(n * is), chunk_begin = take((n + 1) * is);
      chunk_token = take(n * is), chunk_slot = take(n * is), multi_token = take(multi * is);
      multi_slot = take((multi + 1) * is), batch_end = total;
      token_partial = take(ops::token_chunk_slots(n) * d * fs);
      col_scratch = take(ops::column_sum_scratch_floats(int(n), int(std::max(3 * d, f))) * fs);  // bias and LN sums
    }
  };

  // Bytes of the arena for a [batch, seq] micro-batch: known before anything is allocated.
  static std::size_t arena_bytes(const gpt_config& c, int batch, int seq, bool checkpoint) {
    return layout(c, batch, seq, checkpoint).total;
  }

  ops_gpt(Ops& ops, const gpt_config& c, int batch, int seq, bool checkpoint)
      : ops_(ops), c_(c), batch_(batch), seq_(seq), checkpoint_(checkpoint), at_((check(c, batch, seq), c), batch, seq, checkpoint) {
    base_ = static_cast<unsigned char*>(ops_.allocate(at_.total));
    ops_.zero(base_, at_.total);
    ops_.col_scratch = f32(at_.col_scratch);
    batch_host_.assign(at_.batch_end - at_.tokens, 0);
    if constexpr (requires { ops_.reserve_staging(std::size_t{}, std::size_t{}); })  // pinned once, not per step
      ops_.reserve_staging(batch_host_.size(), std::size_t(rows()) * sizeof(float));
  }
  ops_gpt(const ops_gpt&) = delete;
  ops_gpt& operator=(const ops_gpt&) = delete;
  ~ops_gpt() { ops_.deallocate(base_); }

  std::size_t arena_bytes() const noexcept { return at_.total; }
  int rows() const noexcept { return batch_ * seq_; }
  bool checkpointed() const noexcept { return checkpoint_; }
  const gpt_config& config() const noexcept { return c_; }

  // Tokens, targets, and for the token embedding's gradient the rows of each distinct token in
  // bounded chunks (a deterministic gather-sum on the device instead of atomics): one upload.
  void load_batch(const batch& b) {
    if (b.batch_size != batch_ || b.seq_len != seq_)
      throw std::invalid_argument("ops_gpt: batch [" + std::to_string(b.batch_size) + ", " + std::to_string(b.seq_len) +
                                  "] does not match the model's [" + std::to_string(batch_) + ", " +
                                  std::to_string(seq_) + "]");
    const std::size_t n = std::size_t(rows());
    for (std::size_t r = 0; r < n; ++r)
      if (b.tokens[r] < 0 || b.tokens[r] >= c_.vocab || b.targets[r] < 0 || b.targets[r] >= c_.vocab)
        throw std::out_of_range("ops_gpt: token or target at row " + std::to_string(r) + " outside vocab " +
                                std::to_string(c_.vocab));
    chunks_.build(b.tokens, c_.vocab);
    const auto put = [&](std::size_t at, const std::vector<std::int32_t>& v) {
      std::copy(v.begin(), v.end(), reinterpret_cast<std::int32_t*>(batch_host_.data() + (at - at_.tokens)));
    };
    put(at_.tokens, b.tokens), put(at_.targets, b.targets), put(at_.by_row, chunks_.by_row);
    put(at_.chunk_begin, chunks_.chunk_begin), put(at_.chunk_token, chunks_.chunk_token);
    put(at_.chunk_slot, chunks_.chunk_slot), put(at_.multi_token, chunks_.multi_token);
    put(at_.multi_slot, chunks_.multi_slot);
    ops_.upload(base_ + at_.tokens, batch_host_.data(), batch_host_.size());
  }

  // The token embedding gradient's chunks of the last load_batch (pointers into the arena).
  ops::token_chunks token_chunks() const {
    return {ints(at_.by_row), ints(at_.chunk_begin), ints(at_.chunk_token), ints(at_.chunk_slot), ints(at_.multi_token),
            ints(at_.multi_slot), int(chunks_.chunk_token.size()), int(chunks_.multi_token.size()), f32(at_.token_partial)};
  }

  template <class P>
  void embed_forward(const P& p) {
    ops_.embed_forward(ints(at_.tokens), p.param(embed_param::token), p.param(embed_param::position), act(0), batch_,
                       seq_, c_.d_model);
  }

  template <class P>
  void embed_backward(P&& p) {
    ops_.embed_backward(token_chunks(), f32(at_.dres), p.grad(embed_param::token), p.grad(embed_param::position),
                        batch_, seq_, c_.d_model);
  }

  // y = x + attn(ln1(x)); y += mlp(ln2(y)): act(layer) -> act(layer + 1).
  template <class P>
  void block_forward(int layer, const P& p) {
    namespace bp = block_param;
    const auto& k = cache(layer);
    const int n = rows(), d = c_.d_model, f = c_.d_ff;
    const float* x = act(layer);
    ops_.layer_norm_forward(x, p.param(bp::ln1_gain), p.param(bp::ln1_bias), half(k.h1), f32(k.mean1), f32(k.rstd1), n, d);
    ops::matmul(ops_, n, 3 * d, d, half(k.h1), false, p.param(bp::qkv_weight), false, f32(at_.qkv), 0.0f);
    ops_.bias_to_half(f32(at_.qkv), p.param(bp::qkv_bias), half(k.qkv_h), n, 3 * d);
    ops_.attention_forward(half(k.qkv_h), half(k.attn), f32(k.lse), heads(), scale());
    ops::matmul(ops_, n, d, d, half(k.attn), false, p.param(bp::attn_proj_weight), false, f32(at_.proj), 0.0f);
    ops_.residual_layer_norm_forward(x, f32(at_.proj), p.param(bp::attn_proj_bias), f32(k.x2), p.param(bp::ln2_gain),
                                     p.param(bp::ln2_bias), half(k.h2), f32(k.mean2), f32(k.rstd2), n, d);
    ops::matmul(ops_, n, f, d, half(k.h2), false, p.param(bp::fc_weight), false, f32(k.fc_pre), 0.0f);
    ops_.bias_gelu_forward(f32(k.fc_pre), p.param(bp::fc_bias), half(at_.act), n, f);
    ops::matmul(ops_, n, d, f, half(at_.act), false, p.param(bp::mlp_proj_weight), false, f32(at_.mlp), 0.0f);
    ops_.residual_add(f32(k.x2), f32(at_.mlp), p.param(bp::mlp_proj_bias), act(layer + 1), n, d);
  }

  // dres (the gradient of the block's output) becomes the gradient of its input. With
  // checkpointing, block_forward(layer) must have run again just before (the shared cache).
  template <class P>
  void block_backward(int layer, P&& p) {
    namespace bp = block_param;
    const auto& k = cache(layer);
    const int n = rows(), d = c_.d_model, f = c_.d_ff;
    float* dres = f32(at_.dres);
    // MLP branch: y = x2 + proj(gelu(fc(ln2(x2)))).
    ops_.gelu_forward(f32(k.fc_pre), half(at_.act), std::size_t(n) * std::size_t(f));
    ops_.to_half(dres, half(at_.dres_h), std::size_t(n) * std::size_t(d));
    ops::matmul(ops_, f, d, n, half(at_.act), true, half(at_.dres_h), false, p.grad(bp::mlp_proj_weight), 1.0f);
    ops_.bias_grad(dres, p.grad(bp::mlp_proj_bias), n, d);
    ops::matmul(ops_, n, f, d, half(at_.dres_h), false, p.param(bp::mlp_proj_weight), true, f32(at_.dact), 0.0f);
    ops_.gelu_backward(f32(k.fc_pre), f32(at_.dact), half(at_.dfc_h), std::size_t(n) * std::size_t(f));
    ops::matmul(ops_, d, f, n, half(k.h2), true, half(at_.dfc_h), false, p.grad(bp::fc_weight), 1.0f);
    ops_.bias_grad(f32(at_.dact), p.grad(bp::fc_bias), n, f);
    ops::matmul(ops_, n, d, f, half(at_.dfc_h), false, p.param(bp::fc_weight), true, f32(at_.dh), 0.0f);
    ops_.layer_norm_param_grad(f32(at_.dh), f32(k.x2), f32(k.mean2), f32(k.rstd2), p.grad(bp::ln2_gain),
                               p.grad(bp::ln2_bias), n, d);
    ops_.layer_norm_backward(f32(at_.dh), f32(k.x2), f32(k.mean2), f32(k.rstd2), p.param(bp::ln2_gain), dres, n, d);
    // Attention branch: x2 = x + proj(attention(qkv(ln1(x)))).
    ops_.to_half(dres, half(at_.dres_h), std::size_t(n) * std::size_t(d));
    ops::matmul(ops_, d, d, n, half(k.attn), true, half(at_.dres_h), false, p.grad(bp::attn_proj_weight), 1.0f);
    ops_.bias_grad(dres, p.grad(bp::attn_proj_bias), n, d);
    ops::matmul(ops_, n, d, d, half(at_.dres_h), false, p.param(bp::attn_proj_weight), true, f32(at_.datt), 0.0f);
    ops_.attention_backward_prepare(f32(at_.datt), half(k.attn), half(at_.d_o), f32(at_.delta), heads());
    ops_.attention_backward(half(k.qkv_h), half(at_.d_o), f32(k.lse), f32(at_.delta), f32(at_.dqkv), half(at_.dqkv_h),
                            heads(), scale());
    ops::matmul(ops_, d, 3 * d, n, half(k.h1), true, half(at_.dqkv_h), false, p.grad(bp::qkv_weight), 1.0f);
    ops_.bias_grad(f32(at_.dqkv), p.grad(bp::qkv_bias), n, 3 * d);
    ops::matmul(ops_, n, d, 3 * d, half(at_.dqkv_h), false, p.param(bp::qkv_weight), true, f32(at_.dh), 0.0f);
    const float* x = act(layer);
    ops_.layer_norm_param_grad(f32(at_.dh), x, f32(k.mean1), f32(k.rstd1), p.grad(bp::ln1_gain), p.grad(bp::ln1_bias),
                               n, d);
    ops_.layer_norm_backward(f32(at_.dh), x, f32(k.mean1), f32(k.rstd1), p.param(bp::ln1_gain), dres, n, d);
  }

  // logits = ln(x) W; the loss per row, and with grad_weight > 0 (training) the gradient of
  // grad_weight * (sum of row losses) with respect to the logits, ready for head_backward.
  template <class P>
  void head_forward(const P& p, float grad_weight) {
    const int n = rows(), d = c_.d_model, v = c_.vocab;
    ops_.layer_norm_forward(act(c_.n_layers), p.param(head_param::ln_gain), p.param(head_param::ln_bias), half(at_.hf),
                            f32(at_.meanf), f32(at_.rstdf), n, d);
    ops::matmul(ops_, n, v, d, half(at_.hf), false, p.param(head_param::weight), false, f32(at_.logits), 0.0f);
    ops_.cross_entropy(f32(at_.logits), ints(at_.targets), f32(at_.row_loss), grad_weight > 0 ? half(at_.dlogits) : nullptr,
                       grad_weight, n, v);
  }

  // dres = the gradient of the head's input.
  template <class P>
  void head_backward(P&& p) {
    const int n = rows(), d = c_.d_model, v = c_.vocab;
    const float* x = act(c_.n_layers);
    ops::matmul(ops_, d, v, n, half(at_.hf), true, half(at_.dlogits), false, p.grad(head_param::weight), 1.0f);
    ops::matmul(ops_, n, d, v, half(at_.dlogits), false, p.param(head_param::weight), true, f32(at_.dh), 0.0f);
    ops_.layer_norm_param_grad(f32(at_.dh), x, f32(at_.meanf), f32(at_.rstdf), p.grad(head_param::ln_gain),
                               p.grad(head_param::ln_bias), n, d);
    ops_.zero(f32(at_.dres), std::size_t(n) * std::size_t(d) * sizeof(float));
    ops_.layer_norm_backward(f32(at_.dh), x, f32(at_.meanf), f32(at_.rstdf), p.param(head_param::ln_gain),
                             f32(at_.dres), n, d);
  }

  // The mean of the last head_forward's row losses, added in double in row order as the host
  // model does (cross_entropy_forward). Waits for the device.
  double mean_loss() {
    row_loss_.resize(std::size_t(rows()));
    ops_.download(row_loss_.data(), f32(at_.row_loss), row_loss_.size() * sizeof(float));
    double total = 0.0;
    for (float l : row_loss_) total += double(l);
    return total / double(row_loss_.size());
  }

  // For tests: a buffer of the arena, by its layout offset.
  const unsigned char* at(std::size_t offset) const noexcept { return base_ + offset; }
  const layout& where() const noexcept { return at_; }

 private:
  static int check(const gpt_config& c, int batch, int seq) {
    c.validate();
    if (batch < 1 || seq < 1 || seq > c.seq_len)
      throw std::invalid_argument("ops_gpt: need batch >= 1 and 1 <= seq <= seq_len (" + std::to_string(c.seq_len) +
                                  "), got batch " + std::to_string(batch) + ", seq " + std::to_string(seq));
    if constexpr (requires { Ops::max_head_dim; })  // the GPU's fused attention holds a head in shared memory
      if (c.head_dim() > Ops::max_head_dim)
        throw std::invalid_argument("ops_gpt: heads of " + std::to_string(c.head_dim()) + " elements (d_model " +
                                    std::to_string(c.d_model) + " / " + std::to_string(c.n_heads) +
                                    " heads); this backend's attention holds up to " + std::to_string(Ops::max_head_dim));
    return 0;
  }
  const typename layout::cache_at& cache(int layer) const {
    return at_.caches[checkpoint_ ? 0 : std::size_t(layer)];
  }
  math::head_layout heads() const { return {batch_, seq_, c_.n_heads, c_.head_dim()}; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(c_.head_dim())); }
  float* f32(std::size_t off) const { return reinterpret_cast<float*>(base_ + off); }
  half_t* half(std::size_t off) const { return reinterpret_cast<half_t*>(base_ + off); }
  std::int32_t* ints(std::size_t off) const { return reinterpret_cast<std::int32_t*>(base_ + off); }
  float* act(int i) const { return f32(at_.acts[std::size_t(i)]); }

  Ops& ops_;
  gpt_config c_;
  int batch_, seq_;
  bool checkpoint_;
  layout at_;
  unsigned char* base_ = nullptr;
  ops::token_chunk_plan chunks_;
  std::vector<unsigned char> batch_host_;  // the batch region's bytes, uploaded at once
  std::vector<float> row_loss_;
};

}  // namespace gpt

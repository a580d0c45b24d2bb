#pragma once
// The Llama (transformers' LlamaForCausalLM) written once over an Ops (llama_ops.hpp), as
// gpt/ops_model.hpp writes the GPT: the host runs it on host_llama_ops, a GPU on an Ops that
// implements the same operations. Matmul operands (activations and weights) are Ops::half_t,
// matmul results, the residual stream, the norms, the softmax and the loss f32; with
// half_t = float it is transformers' f32 model up to the order of additions, which the tests
// check against transformers itself (tests/examples/test_llama.cpp).
//
// What is the GPT's, reused as it is: the token embedding (embed_forward/backward, with a zero
// table in place of the GPT's positions), the matmuls (ops::matmul: y = x W^T on torch's
// (out, in) weights), the fused causal attention (its [N, 3 d] q | k | v input: grouped-query
// attention's keys and values are repeated into it per query head, as transformers' repeat_kv
// does, and their gradients summed back over the group), the residual adds (with a zero bias),
// and the cross entropy. What is the Llama's (llama_ops.hpp): RMSNorm, RoPE on q and k with the
// repetition, SwiGLU, and labels -100 (a supervised fine-tune's prompt tokens): their rows are
// given target 0 for the kernel, their loss is left out of the mean and their gradient rows
// are zeroed.
//
// The loss is the mean over a set of label tokens: by default this micro-batch's own; with
// set_loss_tokens(n) the gradient is that of (sum of this micro-batch's token losses) / n, so
// ranks and micro-batches that each divide by (label tokens of the global batch) / (ranks x
// micro-batches) average, as the engine averages them, to the gradient of the global batch's
// mean, the loss transformers computes for the whole batch at once.
//
// Memory: one arena from the Ops, sized before anything runs (arena_bytes, what the runner
// reports to the engine as activations). Each block keeps for its backward what it reads
// (RMSNorm statistics, matmul inputs, the attention's q | k | v input and its output and
// log-sum-exp, the residual after attention, the MLP's gate and up); with activation
// checkpointing one such cache serves every block and only each block's input is kept.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../gpt/corpus.hpp"
#include "../gpt/ops_contract.hpp"
#include "../gpt/token_chunks.hpp"
#include "llama_spec.hpp"

namespace llama {

inline constexpr std::int32_t ignore_index = -100;

template <class Ops>
class ops_llama {
 public:
  using half_t = typename Ops::half_t;

  struct layout {
    struct cache_at {
      std::size_t rstd1, h1, qkv, attn, lse, x2, rstd2, h2, gate, up;
    };
    std::vector<std::size_t> acts;  // f32 [N, d]: each block's input, then the head's
    std::vector<cache_at> caches;   // one per block, or one shared with checkpointing
    std::size_t qf, kf, vf, proj, mlp, act;                                                    // forward scratch
    std::size_t dres, dres_h, dact, dgate_h, dup_h, dh, datt, d_o, delta, dqkv, dqkv_h, dq_h, dk_h, dv_h;  // backward
    std::size_t rstdf, hf, logits, dlogits, row_loss;                                          // head, loss
    // the batch's indices, one region uploaded at once (as the GPT's, token_chunks.hpp)
    std::size_t tokens, targets, by_row, chunk_begin, chunk_token, chunk_slot, multi_token, multi_slot, batch_end;
    std::size_t token_partial, cos, sin, zeros, dpos;  // RoPE tables; a zero half_t [T, d]; a scratch f32 [T, d]
    std::size_t total = 0;

    layout(const config& c, int batch, int seq, bool checkpoint) {
      const std::size_t n = std::size_t(batch) * std::size_t(seq), d = std::size_t(c.hidden_size),
                        qd = std::size_t(c.q_dim()), kvd = std::size_t(c.kv_dim()),
                        f = std::size_t(c.intermediate_size), v = std::size_t(c.vocab_size),
                        heads = std::size_t(c.num_attention_heads), half = std::size_t(c.head_dim / 2);
      const std::size_t hs = sizeof(half_t), fs = sizeof(float), is = sizeof(std::int32_t);
      auto take = [&](std::size_t bytes) {
        const std::size_t at = total;
        total += (bytes + 255) / 256 * 256;
        return at;
      };
      for (int l = 0; l <= c.num_hidden_layers; ++l) acts.push_back(take(n * d * fs));
      caches.resize(checkpoint ? 1 : std::size_t(c.num_hidden_layers));
      for (auto& k : caches)
        k = {take(n * fs),      take(n * d * hs), take(3 * n * qd * hs), take(n * qd * hs), take(n * heads * fs),
             take(n * d * fs),  take(n * fs),     take(n * d * hs),      take(n * f * fs),  take(n * f * fs)};
      qf = take(n * qd * fs), kf = take(n * kvd * fs), vf = take(n * kvd * fs);
      proj = take(n * d * fs), mlp = take(n * d * fs), act = take(n * f * hs);
      dres = take(n * d * fs), dres_h = take(n * d * hs), dact = take(n * f * fs), dgate_h = take(n * f * hs);
      dup_h = take(n * f * hs), dh = take(n * d * fs), datt = take(n * qd * fs), d_o = take(n * qd * hs);
      delta = take(n * heads * fs), dqkv = take(3 * n * qd * fs), dqkv_h = take(3 * n * qd * hs);
      dq_h = take(n * qd * hs), dk_h = take(n * kvd * hs), dv_h = take(n * kvd * hs);
      rstdf = take(n * fs), hf = take(n * d * hs), logits = take(n * v * fs), dlogits = take(n * v * hs);
      row_loss = take(n * fs);
      const std::size_t multi = n / gpt::ops::embed_rows_per_chunk + 1;
      tokens = take(n * is), targets = take(n * is), by_row = take(n * is), chunk_begin = take((n + 1) * is);
      chunk_token = take(n * is), chunk_slot = take(n * is), multi_token = take(multi * is);
      multi_slot = take((multi + 1) * is), batch_end = total;
      token_partial = take(gpt::ops::token_chunk_slots(n) * d * fs);
      cos = take(std::size_t(seq) * half * fs), sin = take(std::size_t(seq) * half * fs);
      zeros = take(std::size_t(seq) * d * hs), dpos = take(std::size_t(seq) * d * fs);
    }
  };

  static std::size_t arena_bytes(const config& c, int batch, int seq, bool checkpoint) {
    return layout(c, batch, seq, checkpoint).total;
  }

  ops_llama(Ops& ops, const config& c, int batch, int seq, bool checkpoint)
      : ops_(ops), c_(c), batch_(batch), seq_(seq), checkpoint_(checkpoint),
        at_((check(c, batch, seq), c), batch, seq, checkpoint) {
    base_ = static_cast<unsigned char*>(ops_.allocate(at_.total));
    ops_.zero(base_, at_.total);
    batch_host_.assign(at_.batch_end - at_.tokens, 0);
    // RoPE's angles t * inv_freq[e] in f32 (transformers: position * inv_freq, then cos, sin)
    const std::vector<float> inv = c.inv_freq();
    std::vector<float> cs(std::size_t(seq) * inv.size()), sn(cs.size());
    for (int t = 0; t < seq; ++t)
      for (std::size_t e = 0; e < inv.size(); ++e) {
        const float angle = float(t) * inv[e];
        cs[std::size_t(t) * inv.size() + e] = float(std::cos(double(angle)));
        sn[std::size_t(t) * inv.size() + e] = float(std::sin(double(angle)));
      }
    ops_.upload(base_ + at_.cos, cs.data(), cs.size() * sizeof(float));
    ops_.upload(base_ + at_.sin, sn.data(), sn.size() * sizeof(float));
  }
  ops_llama(const ops_llama&) = delete;
  ops_llama& operator=(const ops_llama&) = delete;
  ~ops_llama() { ops_.deallocate(base_); }

  std::size_t arena_bytes() const noexcept { return at_.total; }
  int rows() const noexcept { return batch_ * seq_; }
  bool checkpointed() const noexcept { return checkpoint_; }
  const config& cfg() const noexcept { return c_; }

  // Tokens in [0, vocab); targets in [0, vocab) or -100 (no loss at that position).
  void load_batch(const gpt::batch& b) {
    if (b.batch_size != batch_ || b.seq_len != seq_)
      throw std::invalid_argument("ops_llama: batch [" + std::to_string(b.batch_size) + ", " +
                                  std::to_string(b.seq_len) + "] does not match the model's [" +
                                  std::to_string(batch_) + ", " + std::to_string(seq_) + "]");
    const std::size_t n = std::size_t(rows());
    targets_.assign(b.targets.begin(), b.targets.end());
    ignored_runs_.clear();
    labels_ = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if (b.tokens[r] < 0 || b.tokens[r] >= c_.vocab_size)
        throw std::out_of_range("ops_llama: token " + std::to_string(b.tokens[r]) + " at row " + std::to_string(r) +
                                " outside vocab " + std::to_string(c_.vocab_size));
      if (b.targets[r] == ignore_index) {
        targets_[r] = 0;  // a valid index for the kernel; its loss and gradient are dropped
        if (ignored_runs_.empty() || ignored_runs_.back().second != r) ignored_runs_.push_back({r, r});
        ++ignored_runs_.back().second;
      } else if (b.targets[r] < 0 || b.targets[r] >= c_.vocab_size) {
        throw std::out_of_range("ops_llama: target " + std::to_string(b.targets[r]) + " at row " + std::to_string(r) +
                                " is neither in vocab " + std::to_string(c_.vocab_size) + " nor -100 (ignored)");
      } else {
        ++labels_;
      }
    }
    // the token embedding's gradient by chunks of each token's rows (the embed op's contract)
    chunks_.build(b.tokens, c_.vocab_size);
    const auto put = [&](std::size_t at, const std::vector<std::int32_t>& v) {
      std::copy(v.begin(), v.end(), reinterpret_cast<std::int32_t*>(batch_host_.data() + (at - at_.tokens)));
    };
    put(at_.tokens, b.tokens), put(at_.targets, targets_), put(at_.by_row, chunks_.by_row);
    put(at_.chunk_begin, chunks_.chunk_begin), put(at_.chunk_token, chunks_.chunk_token);
    put(at_.chunk_slot, chunks_.chunk_slot), put(at_.multi_token, chunks_.multi_token);
    put(at_.multi_slot, chunks_.multi_slot);
    ops_.upload(base_ + at_.tokens, batch_host_.data(), batch_host_.size());
  }

  // Label tokens (targets other than -100) of the last batch loaded.
  std::size_t label_tokens() const noexcept { return labels_; }
  // What the loss of every later micro-batch divides its sum by (0: its own label tokens).
  void set_loss_tokens(double n) { loss_tokens_ = n; }
  // The divisor of the last batch's loss; never 0 (a batch without labels has no gradient).
  float loss_denominator() const noexcept {
    const double n = loss_tokens_ > 0 ? loss_tokens_ : double(labels_);
    return n > 0 ? float(n) : 1.0f;
  }

  template <class P>
  void embed_forward(const P& p) {
    ops_.embed_forward(ints(at_.tokens), p.param(embed_param::token), half(at_.zeros), act(0), batch_, seq_,
                       c_.hidden_size);
  }
  template <class P>
  void embed_backward(P&& p) {
    const gpt::ops::token_chunks tc{ints(at_.by_row),      ints(at_.chunk_begin), ints(at_.chunk_token),
                                    ints(at_.chunk_slot),  ints(at_.multi_token), ints(at_.multi_slot),
                                    int(chunks_.chunk_token.size()), int(chunks_.multi_token.size()),
                                    f32(at_.token_partial)};
    ops_.embed_backward(tc, f32(at_.dres), p.grad(embed_param::token), f32(at_.dpos), batch_, seq_, c_.hidden_size);
  }

  // x + attn(rms1(x)), then + mlp(rms2(.)): act(layer) -> act(layer + 1).
  template <class P>
  void block_forward(int layer, const P& p) {
    namespace bp = block_param;
    const auto& k = cache(layer);
    const int n = rows(), d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(), f = c_.intermediate_size;
    const float eps = float(c_.rms_norm_eps);
    const float* x = act(layer);
    ops_.rms_norm_forward(x, p.param(bp::attn_norm), half(k.h1), f32(k.rstd1), n, d, eps);
    gpt::ops::matmul(ops_, n, qd, d, half(k.h1), false, p.param(bp::q), true, f32(at_.qf), 0.0f);
    gpt::ops::matmul(ops_, n, kvd, d, half(k.h1), false, p.param(bp::k), true, f32(at_.kf), 0.0f);
    gpt::ops::matmul(ops_, n, kvd, d, half(k.h1), false, p.param(bp::v), true, f32(at_.vf), 0.0f);
    ops_.qkv_rope_forward(f32(at_.qf), f32(at_.kf), f32(at_.vf), f32(at_.cos), f32(at_.sin), half(k.qkv), q_heads(),
                          c_.num_key_value_heads);
    ops_.attention_forward(half(k.qkv), half(k.attn), f32(k.lse), q_heads(), scale());
    gpt::ops::matmul(ops_, n, d, qd, half(k.attn), false, p.param(bp::o), true, f32(at_.proj), 0.0f);
    ops_.residual_add(x, f32(at_.proj), half(at_.zeros), f32(k.x2), n, d);
    ops_.rms_norm_forward(f32(k.x2), p.param(bp::mlp_norm), half(k.h2), f32(k.rstd2), n, d, eps);
    gpt::ops::matmul(ops_, n, f, d, half(k.h2), false, p.param(bp::gate), true, f32(k.gate), 0.0f);
    gpt::ops::matmul(ops_, n, f, d, half(k.h2), false, p.param(bp::up), true, f32(k.up), 0.0f);
    ops_.swiglu_forward(f32(k.gate), f32(k.up), half(at_.act), std::size_t(n) * std::size_t(f));
    gpt::ops::matmul(ops_, n, d, f, half(at_.act), false, p.param(bp::down), true, f32(at_.mlp), 0.0f);
    ops_.residual_add(f32(k.x2), f32(at_.mlp), half(at_.zeros), act(layer + 1), n, d);
  }

  // dres (the gradient of the block's output) becomes the gradient of its input. With
  // checkpointing, block_forward(layer) must have run again just before (the shared cache).
  template <class P>
  void block_backward(int layer, P&& p) {
    namespace bp = block_param;
    const auto& k = cache(layer);
    const int n = rows(), d = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(), f = c_.intermediate_size;
    float* dres = f32(at_.dres);
    // MLP branch: y = x2 + down(silu(gate(h2)) * up(h2)), h2 = rms2(x2).
    ops_.swiglu_forward(f32(k.gate), f32(k.up), half(at_.act), std::size_t(n) * std::size_t(f));
    ops_.to_half(dres, half(at_.dres_h), std::size_t(n) * std::size_t(d));
    gpt::ops::matmul(ops_, d, f, n, half(at_.dres_h), true, half(at_.act), false, p.grad(bp::down), 1.0f);
    gpt::ops::matmul(ops_, n, f, d, half(at_.dres_h), false, p.param(bp::down), false, f32(at_.dact), 0.0f);
    ops_.swiglu_backward(f32(k.gate), f32(k.up), f32(at_.dact), half(at_.dgate_h), half(at_.dup_h),
                         std::size_t(n) * std::size_t(f));
    gpt::ops::matmul(ops_, f, d, n, half(at_.dgate_h), true, half(k.h2), false, p.grad(bp::gate), 1.0f);
    gpt::ops::matmul(ops_, f, d, n, half(at_.dup_h), true, half(k.h2), false, p.grad(bp::up), 1.0f);
    gpt::ops::matmul(ops_, n, d, f, half(at_.dgate_h), false, p.param(bp::gate), false, f32(at_.dh), 0.0f);
    gpt::ops::matmul(ops_, n, d, f, half(at_.dup_h), false, p.param(bp::up), false, f32(at_.dh), 1.0f);
    ops_.rms_norm_param_grad(f32(at_.dh), f32(k.x2), f32(k.rstd2), p.grad(bp::mlp_norm), n, d);
    ops_.rms_norm_backward(f32(at_.dh), f32(k.x2), f32(k.rstd2), p.param(bp::mlp_norm), dres, n, d);
    // Attention branch: x2 = x + o(attention(rope(q(h1)), rope(k(h1)), v(h1))), h1 = rms1(x).
    ops_.to_half(dres, half(at_.dres_h), std::size_t(n) * std::size_t(d));
    gpt::ops::matmul(ops_, d, qd, n, half(at_.dres_h), true, half(k.attn), false, p.grad(bp::o), 1.0f);
    gpt::ops::matmul(ops_, n, qd, d, half(at_.dres_h), false, p.param(bp::o), false, f32(at_.datt), 0.0f);
    ops_.attention_backward_prepare(f32(at_.datt), half(k.attn), half(at_.d_o), f32(at_.delta), q_heads());
    ops_.attention_backward(half(k.qkv), half(at_.d_o), f32(k.lse), f32(at_.delta), f32(at_.dqkv), half(at_.dqkv_h),
                            q_heads(), scale());
    ops_.qkv_rope_backward(f32(at_.dqkv), f32(at_.cos), f32(at_.sin), half(at_.dq_h), half(at_.dk_h), half(at_.dv_h),
                           q_heads(), c_.num_key_value_heads);
    gpt::ops::matmul(ops_, qd, d, n, half(at_.dq_h), true, half(k.h1), false, p.grad(bp::q), 1.0f);
    gpt::ops::matmul(ops_, kvd, d, n, half(at_.dk_h), true, half(k.h1), false, p.grad(bp::k), 1.0f);
    gpt::ops::matmul(ops_, kvd, d, n, half(at_.dv_h), true, half(k.h1), false, p.grad(bp::v), 1.0f);
    gpt::ops::matmul(ops_, n, d, qd, half(at_.dq_h), false, p.param(bp::q), false, f32(at_.dh), 0.0f);
    gpt::ops::matmul(ops_, n, d, kvd, half(at_.dk_h), false, p.param(bp::k), false, f32(at_.dh), 1.0f);
    gpt::ops::matmul(ops_, n, d, kvd, half(at_.dv_h), false, p.param(bp::v), false, f32(at_.dh), 1.0f);
    const float* x = act(layer);
    ops_.rms_norm_param_grad(f32(at_.dh), x, f32(k.rstd1), p.grad(bp::attn_norm), n, d);
    ops_.rms_norm_backward(f32(at_.dh), x, f32(k.rstd1), p.param(bp::attn_norm), dres, n, d);
  }

  // logits = rms(x) W^T; the loss per row, and with grad_weight > 0 (training) the gradient of
  // grad_weight x (sum of the label rows' losses) with respect to the logits.
  template <class P>
  void head_forward(const P& p, float grad_weight) {
    const int n = rows(), d = c_.hidden_size, v = c_.vocab_size;
    ops_.rms_norm_forward(act(c_.num_hidden_layers), p.param(head_param::norm), half(at_.hf), f32(at_.rstdf), n, d,
                          float(c_.rms_norm_eps));
    gpt::ops::matmul(ops_, n, v, d, half(at_.hf), false, p.param(head_param::weight), true, f32(at_.logits), 0.0f);
    half_t* dl = grad_weight > 0 ? half(at_.dlogits) : nullptr;
    ops_.cross_entropy(f32(at_.logits), ints(at_.targets), f32(at_.row_loss), dl, grad_weight, n, v);
    if (dl)
      for (const auto& [b, e] : ignored_runs_)
        ops_.zero(dl + b * std::size_t(v), (e - b) * std::size_t(v) * sizeof(half_t));
  }

  // dres = the gradient of the head's input.
  template <class P>
  void head_backward(P&& p) {
    const int n = rows(), d = c_.hidden_size, v = c_.vocab_size;
    const float* x = act(c_.num_hidden_layers);
    gpt::ops::matmul(ops_, v, d, n, half(at_.dlogits), true, half(at_.hf), false, p.grad(head_param::weight), 1.0f);
    gpt::ops::matmul(ops_, n, d, v, half(at_.dlogits), false, p.param(head_param::weight), false, f32(at_.dh), 0.0f);
    ops_.rms_norm_param_grad(f32(at_.dh), x, f32(at_.rstdf), p.grad(head_param::norm), n, d);
    ops_.zero(f32(at_.dres), std::size_t(n) * std::size_t(d) * sizeof(float));
    ops_.rms_norm_backward(f32(at_.dh), x, f32(at_.rstdf), p.param(head_param::norm), f32(at_.dres), n, d);
  }

  // The last head_forward's loss: its label rows' losses added in double in row order, over
  // loss_denominator(). Waits for the device.
  double mean_loss() {
    row_loss_.resize(std::size_t(rows()));
    ops_.download(row_loss_.data(), f32(at_.row_loss), row_loss_.size() * sizeof(float));
    std::size_t run = 0;
    double total = 0.0;
    for (std::size_t r = 0; r < row_loss_.size(); ++r) {
      while (run < ignored_runs_.size() && ignored_runs_[run].second <= r) ++run;
      if (run < ignored_runs_.size() && ignored_runs_[run].first <= r) continue;
      total += double(row_loss_[r]);
    }
    return total / double(loss_denominator());
  }

  // The last head_forward's logits, [rows, vocab] row-major (waits for the device).
  std::vector<float> logits() {
    std::vector<float> out(std::size_t(rows()) * std::size_t(c_.vocab_size));
    ops_.download(out.data(), f32(at_.logits), out.size() * sizeof(float));
    return out;
  }

 private:
  static int check(const config& c, int batch, int seq) {
    if (batch < 1 || seq < 1)
      throw std::invalid_argument("ops_llama: need batch >= 1 and seq >= 1, got batch " + std::to_string(batch) +
                                  ", seq " + std::to_string(seq));
    if (c.hidden_size < 1 || c.num_hidden_layers < 1 || c.num_attention_heads < 1 || c.num_key_value_heads < 1 ||
        c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim < 2 || c.head_dim % 2 != 0)
      throw std::invalid_argument("ops_llama: the config's shape is not a Llama's (read it with read_hf_llama_config)");
    return 0;
  }
  const typename layout::cache_at& cache(int layer) const { return at_.caches[checkpoint_ ? 0 : std::size_t(layer)]; }
  gpt::math::head_layout q_heads() const { return {batch_, seq_, c_.num_attention_heads, c_.head_dim}; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(c_.head_dim)); }
  float* f32(std::size_t off) const { return reinterpret_cast<float*>(base_ + off); }
  half_t* half(std::size_t off) const { return reinterpret_cast<half_t*>(base_ + off); }
  std::int32_t* ints(std::size_t off) const { return reinterpret_cast<std::int32_t*>(base_ + off); }
  float* act(int i) const { return f32(at_.acts[std::size_t(i)]); }

  Ops& ops_;
  config c_;
  int batch_, seq_;
  bool checkpoint_;
  layout at_;
  unsigned char* base_ = nullptr;
  std::vector<std::int32_t> targets_;
  gpt::ops::token_chunk_plan chunks_;
  std::vector<unsigned char> batch_host_;
  std::vector<std::pair<std::size_t, std::size_t>> ignored_runs_;  // [first, end) rows without a label
  std::size_t labels_ = 0;
  double loss_tokens_ = 0;
  std::vector<float> row_loss_;
};

}  // namespace llama

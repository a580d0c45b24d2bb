#pragma once
// Causal self-attention by tiles (flash-style), one query row's math at a time, written once for
// the host and the GPU as gpt_math.hpp is: the CUDA kernels (cuda/attention_kernels.cuh) and
// the host loops (host_ops.hpp) call these functions, and the CPU tests hold the host loops to
// the Eigen layer in float64 (tests/examples/test_gpt_attention.cpp).
//
// Forward: a query row meets the keys a tile of attention_tile at a time and keeps only its
// running statistics (online_softmax: the largest scaled score so far and the sum of
// exp(score x scale - that max)) and its output row, rescaled by alpha whenever the max moves:
//   alpha = online_softmax_rescale(row, tile max)        row.sum *= alpha
//   p_j   = attention_weight(s_j, row.max, scale)        0 for a masked key
//   row.sum += sum_j p_j;  out = out x alpha + sum_j half(p_j) v_j
// and at the end out / row.sum and the log-sum-exp row.max + log(row.sum). The [T, T] scores
// and probabilities exist one tile at a time, never in memory.
// Backward: the probabilities are recomputed from the saved log-sum-exp,
//   p_ij = attention_prob(s_ij, lse_i, scale),  delta_i = <dout_i, out_i>,
//   ds_ij = softmax_grad(p_ij, dp_ij, delta_i, scale) with dp_ij = <dout_i, v_j>,
// so dv_j = sum_i half(p_ij) dout_i, dk_j = sum_i half(ds_ij) q_i, dq_i = sum_j half(ds_ij) k_j.
// "half" is the storage type of matmul operands (bf16 on the GPU): p and ds are rounded where
// the GPU's tensor-core products read them.
//
// The same running statistics give the softmax cross-entropy in one pass over a row of logits
// (online_softmax_push per element, online_softmax_merge to combine partial rows).
#include "gpt_math.hpp"

namespace gpt::math {

// Queries per block and keys per tile on the GPU; the host walks the keys in the same tiles, so
// the running max moves at the same keys on both.
inline constexpr int attention_tile = 64;
// The kernels hold a head of up to this many elements (padded to a multiple of 16) in shared memory.
inline constexpr int attention_max_head_dim = 128;

struct online_softmax {
  float max = -INFINITY;  // largest value seen (a scaled score, or a logit)
  float sum = 0.0f;       // sum of exp(value - max) over the values seen
};

// Moves the row's max to cover a tile whose largest value is tile_max (-INFINITY: every key of
// the tile masked). Returns alpha, the factor for what was accumulated against the old max
// (row.sum is rescaled here; the caller rescales its output row): 0 when nothing was.
GPT_HD float online_softmax_rescale(online_softmax& row, float tile_max) {
  const float m = fmaxf(row.max, tile_max);
  const float alpha = row.max == -INFINITY ? 0.0f : expf(row.max - m);
  row.max = m;
  row.sum *= alpha;
  return alpha;
}
// One more value (cross-entropy's one pass): one exp whichever way the max moves.
GPT_HD void online_softmax_push(online_softmax& row, float x) {
  if (x > row.max) {
    row.sum = row.sum * expf(row.max - x) + 1.0f;  // exp(-inf) = 0 for the first value
    row.max = x;
  } else if (x != -INFINITY) {
    row.sum += expf(x - row.max);
  }
}
// The statistics of the union of two disjoint parts of a row.
GPT_HD online_softmax online_softmax_merge(online_softmax a, online_softmax b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return a;
  online_softmax out;
  out.max = m;
  out.sum = (a.max == -INFINITY ? 0.0f : a.sum * expf(a.max - m)) + (b.max == -INFINITY ? 0.0f : b.sum * expf(b.max - m));
  return out;
}
GPT_HD float online_softmax_lse(const online_softmax& row) { return row.max + logf(row.sum); }

// exp(s scale - row max): an unnormalised probability in (0, 1] against the running max.
GPT_HD float attention_weight(float s, float row_max, float scale) { return expf(s * scale - row_max); }
// The output row's update for one tile: out x alpha + (half(p) . v over the tile).
GPT_HD float attention_accumulate(float out, float alpha, float pv) { return out * alpha + pv; }
GPT_HD float attention_output(float out, float row_sum) { return out / row_sum; }
// The normalised probability, recomputed in the backward from the forward's log-sum-exp.
GPT_HD float attention_prob(float s, float lse, float scale) { return expf(s * scale - lse); }
// Key j is seen by query i (both in [0, seq)) under the causal mask.
GPT_HD bool attention_sees(int query, int key, int seq) { return key <= query && query < seq; }

}  // namespace gpt::math

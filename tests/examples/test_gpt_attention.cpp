// The GPT's fused causal attention (examples/gpt/attention_math.hpp, the math its CUDA kernels
// run; host_ops.hpp's loops over it) against the Eigen attention layer in float64: forward
// (output and log-sum-exp) and backward (the gradients of q, k and v), at sequence lengths and
// head sizes that are not multiples of the GPU's tile (64 keys, heads padded to 16), with key
// tiles of other widths too; the online-softmax statistics against the two-pass softmax; and
// the model's arena, which holds no [T, T] term any more.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../../examples/gpt/gpt_layers.hpp"
#include "../../examples/gpt/host_ops.hpp"
#include "../../examples/gpt/ops_model.hpp"

namespace {

std::vector<float> attention_random(std::size_t n, double sd, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

// max |got - want| / max |want| over a tensor of n elements, got stored as H.
template <class H>
double attention_rel_err(const H* got, const double* want, std::size_t n) {
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(gpt::math::load(got[i])) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

struct attention_errors {
  double out = 0, lse = 0, dqkv = 0;
};

// One case: qkv [B T, 3d] = x + bias through bias_to_half, attention forward, backward of a
// random upstream gradient, each against the Eigen layer on the same (rounded) inputs in float64.
template <class H>
attention_errors attention_case(int B, int T, int heads, int hd, int tile, double sd, unsigned seed) {
  const int d = heads * hd, N = B * T;
  const gpt::math::head_layout hl{B, T, heads, hd};
  const float scale = 1.0f / std::sqrt(float(hd));
  const auto x = attention_random(std::size_t(N) * 3 * d, sd, seed), dout = attention_random(std::size_t(N) * d, 1.0, seed + 1);
  std::vector<H> bias(std::size_t(3 * d));
  for (std::size_t c = 0; c < bias.size(); ++c) bias[c] = gpt::math::store<H>(0.1f * float(int(c % 7) - 3));
  gpt::host_ops<H> o;
  o.attention_tile = tile;
  std::vector<H> qkv(x.size()), out(std::size_t(N) * d), d_out_half(out.size()), dqkv_half(x.size());
  std::vector<float> lse(std::size_t(N) * heads), delta(lse.size()), dqkv(x.size());
  o.bias_to_half(x.data(), bias.data(), qkv.data(), N, 3 * d);
  o.attention_forward(qkv.data(), out.data(), lse.data(), hl, scale);
  o.attention_backward_prepare(dout.data(), out.data(), d_out_half.data(), delta.data(), hl);
  o.attention_backward(qkv.data(), d_out_half.data(), lse.data(), delta.data(), dqkv.data(), dqkv_half.data(), hl, scale);

  gpt::mat<double> q64(N, 3 * d), att, out64, dqkv64, dp, dout64(N, d);
  for (std::size_t i = 0; i < qkv.size(); ++i) q64.data()[i] = gpt::math::load(qkv[i]);
  for (std::size_t i = 0; i < out.size(); ++i) dout64.data()[i] = gpt::math::load(d_out_half[i]);
  gpt::layers::causal_attention_forward<double>(q64, B, T, heads, att, out64);
  gpt::layers::causal_attention_backward<double>(q64, att, dout64, B, T, heads, dqkv64, dp);
  attention_errors e;
  e.out = attention_rel_err(out.data(), out64.data(), out.size());
  e.dqkv = attention_rel_err(dqkv.data(), dqkv64.data(), dqkv.size());
  for (int b = 0; b < B; ++b)  // log-sum-exp of the scaled scores, two-pass in float64
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < T; ++i) {
        const auto qi = q64.block(b * T + i, h * hd, 1, hd);
        std::vector<double> s;
        for (int j = 0; j <= i; ++j) s.push_back((qi.array() * q64.block(b * T + j, d + h * hd, 1, hd).array()).sum() / std::sqrt(double(hd)));
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        const double want = m + std::log(sum);
        e.lse = std::max(e.lse, std::abs(double(lse[(std::size_t(b) * heads + h) * T + i]) - want) / (1 + std::abs(want)));
      }
  for (std::size_t i = 0; i < dqkv.size(); ++i)  // the half copy is the f32 gradient rounded
    REQUIRE(gpt::math::load(dqkv_half[i]) == gpt::math::load(gpt::math::store<H>(dqkv[i])));
  return e;
}

}  // namespace

TEST_CASE("online softmax: rescale by tiles, push and merge give the two-pass statistics (float64), masked values too") {
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> u(-40.0, 40.0);
  for (int n : {1, 5, 64, 200}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = float(u(rng));
    if (n > 4) v[2] = -INFINITY;  // a masked key
    double m = -INFINITY, sum = 0;
    for (float x : v) m = std::max(m, double(x));
    for (float x : v) sum += std::exp(double(x) - m);
    const double want = m + std::log(sum);
    INFO("n " << n);
    for (int tile : {1, 3, 64}) {  // by tiles, as the attention forward
      gpt::math::online_softmax row;
      for (int k0 = 0; k0 < n; k0 += tile) {
        float tile_max = -INFINITY, tile_sum = 0;
        for (int j = k0; j < std::min(n, k0 + tile); ++j) tile_max = std::max(tile_max, v[std::size_t(j)]);
        gpt::math::online_softmax_rescale(row, tile_max);
        for (int j = k0; j < std::min(n, k0 + tile); ++j)
          tile_sum += v[std::size_t(j)] == -INFINITY ? 0.0f : gpt::math::attention_weight(v[std::size_t(j)], row.max, 1.0f);
        row.sum += tile_sum;
      }
      CHECK(std::abs(gpt::math::online_softmax_lse(row) - want) < 1e-6 * (1 + std::abs(want)));
    }
    gpt::math::online_softmax pushed, left, right;  // one value at a time; two halves merged
    for (float x : v) gpt::math::online_softmax_push(pushed, x);
    for (int j = 0; j < n; ++j) gpt::math::online_softmax_push(j < n / 3 ? left : right, v[std::size_t(j)]);
    const auto merged = gpt::math::online_softmax_merge(left, right);
    CHECK(pushed.max == float(m));
    CHECK(std::abs(gpt::math::online_softmax_lse(pushed) - want) < 1e-6 * (1 + std::abs(want)));
    CHECK(std::abs(gpt::math::online_softmax_lse(merged) - want) < 1e-6 * (1 + std::abs(want)));
    CHECK(gpt::math::online_softmax_merge(gpt::math::online_softmax{}, pushed).sum == pushed.sum);
  }
  gpt::math::online_softmax empty;  // every key of a tile masked: nothing accumulated, no NaN
  CHECK(gpt::math::online_softmax_rescale(empty, -INFINITY) == 0.0f);
  CHECK(empty.max == -INFINITY);
  CHECK(empty.sum == 0.0f);
  gpt::math::online_softmax_push(empty, -INFINITY);
  CHECK(empty.sum == 0.0f);
}

TEST_CASE("host_ops: fused causal attention forward and backward against the Eigen layer in float64, sizes off the tile") {
  struct shape {
    int B, T, heads, hd, tile;
  };
  // Sequences around the GPU's 64-key tile and not multiples of it; heads not multiples of 16
  // (the GPU pads to 16) and one above 64; key tiles of 64 and of odd widths.
  for (const shape s : {shape{1, 1, 1, 5, 64}, shape{2, 7, 3, 5, 3}, shape{1, 65, 2, 24, 64}, shape{2, 130, 1, 72, 64},
                        shape{1, 150, 2, 16, 64}, shape{1, 100, 1, 8, 7}}) {
    INFO("B " << s.B << " T " << s.T << " heads " << s.heads << " head_dim " << s.hd << " tile " << s.tile);
    const auto e = attention_case<float>(s.B, s.T, s.heads, s.hd, s.tile, 1.5, 31);
    MESSAGE("f32, T " << s.T << " hd " << s.hd << " tile " << s.tile << ": out " << e.out << ", lse " << e.lse
            << ", dqkv " << e.dqkv);
    CHECK(e.out < 1e-6);  // measured <= 3.4e-7
    CHECK(e.lse < 1e-6);  // <= 1.6e-7
    CHECK(e.dqkv < 2e-6);  // <= 4.2e-7
  }
  // Large scores: the running max moves by far between tiles; exp never overflows.
  const auto wide = attention_case<float>(1, 130, 1, 24, 64, 6.0, 37);
  MESSAGE("f32, scores of sd ~30: out " << wide.out << ", lse " << wide.lse << ", dqkv " << wide.dqkv);
  CHECK(wide.out < 5e-6);   // measured 1.1e-6
  CHECK(wide.lse < 1e-6);   // 1.7e-7
  CHECK(wide.dqkv < 2e-5);  // 3.1e-6: near-one-hot rows, ds a difference of nearly equal terms
  // bf16 operands, as on the GPU (p and ds rounded where the tensor cores read them): within a
  // few bf16 units (2^-8) of the float64 result on the same rounded q, k, v.
  const auto half = attention_case<zshard::bf16>(2, 130, 2, 40, 64, 1.5, 41);
  MESSAGE("bf16, T 130 hd 40: out " << half.out << ", lse " << half.lse << ", dqkv " << half.dqkv);
  CHECK(half.out < 2.0 / 256);   // measured 2.3e-3
  CHECK(half.lse < 1e-6);        // 9.2e-8: the statistics stay in f32
  CHECK(half.dqkv < 2.0 / 256);  // 2.6e-3
}

TEST_CASE("host_ops: the attention's key tile width changes only rounding") {
  const int B = 1, T = 97, H = 2, hd = 12, d = H * hd, N = B * T;
  const gpt::math::head_layout hl{B, T, H, hd};
  const auto x = attention_random(std::size_t(N) * 3 * d, 2.0, 43);
  const std::vector<float> zero(std::size_t(3 * d), 0.0f);
  std::vector<float> qkv(x.size()), lse_a(std::size_t(N) * H), lse_b(lse_a.size()), out_a(std::size_t(N) * d), out_b(out_a.size());
  gpt::host_ops<float> a, b;
  a.bias_to_half(x.data(), zero.data(), qkv.data(), N, 3 * d);
  b.attention_tile = 5;
  a.attention_forward(qkv.data(), out_a.data(), lse_a.data(), hl, 0.3f);
  b.attention_forward(qkv.data(), out_b.data(), lse_b.data(), hl, 0.3f);
  double worst = 0;
  for (std::size_t i = 0; i < out_a.size(); ++i) worst = std::max(worst, double(std::abs(out_a[i] - out_b[i])));
  for (std::size_t i = 0; i < lse_a.size(); ++i) worst = std::max(worst, double(std::abs(lse_a[i] - lse_b[i])));
  CHECK(worst < 1e-5);
  CHECK(worst > 0);  // the tiles are walked differently (not the same code path by accident)
}

TEST_CASE("ops_gpt arena: no [T, T] term: twice the sequence at half the batch costs the same bytes") {
  const gpt::gpt_config c{.vocab = 50, .seq_len = 256, .d_model = 48, .n_heads = 4, .n_layers = 3, .d_ff = 96};
  using ops = gpt::host_ops<zshard::bf16>;
  for (bool checkpoint : {false, true}) {
    const std::size_t long_rows = gpt::ops_gpt<ops>::arena_bytes(c, 1, 256, checkpoint);
    const std::size_t short_rows = gpt::ops_gpt<ops>::arena_bytes(c, 2, 128, checkpoint);
    CHECK(long_rows == short_rows);
  }
}

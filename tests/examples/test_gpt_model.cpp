// The GPT example's math, alone (no engine): gradients against finite differences for every
// parameter of every module kind, accumulation and recompute semantics the engine relies on,
// deterministic init, clear errors for bad shapes and tokens, and float/double agreement.
// The corpus and a short training run are in test_gpt_training.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "../../examples/gpt/gpt_model.hpp"

namespace {

using gpt::mat;

gpt::gpt_config tiny_config() {
  return {.vocab = 11, .seq_len = 6, .d_model = 8, .n_heads = 2, .n_layers = 2, .d_ff = 12};
}

double normal_ish(gpt::rng& r) {
  double s = 0;
  for (int i = 0; i < 4; ++i) s += r.uniform();
  return (s - 2.0) * 1.7320508075688772;
}

mat<double> random_mat(gpt::index rows, gpt::index cols, uint64_t seed, double scale = 1.0) {
  gpt::rng r{seed};
  mat<double> m(rows, cols);
  for (gpt::index i = 0; i < m.size(); ++i) m.data()[i] = scale * normal_ish(r);
  return m;
}

// Init values are tuned for training (zero biases, unit gains, tiny residual weights), which
// would leave some gradient paths near zero; a gradient check wants every path O(1).
void randomise(gpt::plain_params<double>& p, const gpt::module_desc& m, uint64_t seed) {
  gpt::rng r{seed};
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    const auto& d = m.params[k];
    const double fan_in = d.shape.size() == 2 ? static_cast<double>(d.shape[0]) : 1.0;
    for (auto& v : p.values[k])
      v = d.init == gpt::init_rule::ones    ? 1.0 + 0.3 * normal_ish(r)
          : d.init == gpt::init_rule::zeros ? 0.3 * normal_ish(r)
                                            : normal_ish(r) / std::sqrt(fan_in);
  }
}

// Module k of tiny_config()'s model (0 the embedding, 1 a block, 3 the head), randomised from
// `seed`: the layer a gradient check perturbs.
struct layer_check {
  const gpt::gpt_config c = tiny_config();
  const gpt::module_desc desc;
  gpt::plain_params<double> p;
  layer_check(std::size_t k, uint64_t seed) : desc(gpt::describe(c)[k]), p(desc, 1) { randomise(p, desc, seed); }
};

std::vector<int32_t> random_tokens(std::size_t n, int vocab, uint64_t seed) {
  gpt::rng r{seed};
  std::vector<int32_t> t(n);
  for (auto& x : t) x = r.below(vocab);
  return t;
}

// Central differences on sampled elements of `values`, compared with `analytic`.
struct grad_checker {
  gpt::rng r{12345};
  double worst = 0.0;
  int checked = 0;

  void check(std::vector<double>& values, const std::vector<double>& analytic, const std::function<double()>& f,
             const std::string& what, int samples = 6, const std::vector<std::size_t>& candidates = {}) {
    for (int s = 0; s < samples; ++s) {
      const std::size_t i = candidates.empty()
                                ? static_cast<std::size_t>(r.below(static_cast<int>(values.size())))
                                : candidates[static_cast<std::size_t>(r.below(static_cast<int>(candidates.size())))];
      check_one(values[i], analytic[i], f, what + "[" + std::to_string(i) + "]");
    }
  }

  // `samples` random elements of data[0, n) against grad.
  void check_elements(double* data, const double* grad, gpt::index n, int samples, const std::function<double()>& f,
                      const std::string& what) {
    for (int s = 0; s < samples; ++s) {
      const auto i = static_cast<gpt::index>(r.below(static_cast<int>(n)));
      check_one(data[i], grad[i], f, what + "[" + std::to_string(i) + "]");
    }
  }

  // Every parameter of a layer, then its input x against dx; says the worst error.
  template <class Params, class Desc>
  void check_layer(Params& p, const Desc& desc, mat<double>& x, const mat<double>& dx,
                   const std::function<double()>& f, const std::string& layer) {
    for (std::size_t k = 0; k < desc.params.size(); ++k) check(p.values[k], p.grads[k], f, desc.params[k].name);
    check_elements(x.data(), dx.data(), x.size(), 10, f, layer + ".dx");
    MESSAGE(layer << ": " << checked << " elements, worst relative error " << worst);
  }

  void check_one(double& v, double analytic, const std::function<double()>& f, const std::string& what) {
    constexpr double eps = 1e-5;
    const double saved = v;
    v = saved + eps;
    const double up = f();
    v = saved - eps;
    const double down = f();
    v = saved;
    const double numeric = (up - down) / (2 * eps);
    // Relative error, with a floor: some gradients are exactly zero (the key bias shifts
    // every score of a softmax row equally), and their numeric estimate is rounding noise
    // (~|f| * 1e-16 / eps ~ 1e-10), so below 1e-2 the check becomes |diff| < 1e-8.
    const double err = std::abs(numeric - analytic) / std::max({std::abs(numeric), std::abs(analytic), 1e-2});
    worst = std::max(worst, err);
    ++checked;
    INFO(what << ": analytic " << analytic << " numeric " << numeric);
    CHECK(err < 1e-6);
  }
};

double dot(const mat<double>& a, const mat<double>& b) { return (a.array() * b.array()).sum(); }

}  // namespace

TEST_CASE("gpt_config::validate names the problem") {
  auto c = tiny_config();
  CHECK_NOTHROW(c.validate());
  c.n_heads = 3;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("divisible by n_heads"), std::invalid_argument);
  c = tiny_config();
  c.vocab = 1;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("vocab"), std::invalid_argument);
  c = tiny_config();
  c.d_ff = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("d_ff"), std::invalid_argument);
}

TEST_CASE("describe lists modules in forward order with unique names and the right shapes") {
  const auto c = tiny_config();
  const auto mods = gpt::describe(c);
  REQUIRE(mods.size() == static_cast<std::size_t>(c.n_layers + 3));
  std::vector<std::string> order;
  for (const auto& m : mods) order.push_back(m.name);
  CHECK(order == std::vector<std::string>{"embed", "block0", "block1", "head", "loss"});
  CHECK(mods[4].params.empty());
  CHECK(mods[0].params.size() == gpt::embed_param::count);
  CHECK(mods[1].params.size() == gpt::block_param::count);
  CHECK(mods[3].params.size() == gpt::head_param::count);
  CHECK(mods[1].params[gpt::block_param::qkv_weight].shape == std::vector<int64_t>{8, 24});
  CHECK(mods[1].params[gpt::block_param::mlp_proj_weight].shape == std::vector<int64_t>{12, 8});
  CHECK(mods[3].params[gpt::head_param::weight].shape == std::vector<int64_t>{8, 11});
  std::set<std::string> names;
  int64_t total = 0;
  for (const auto& m : mods)
    for (const auto& p : m.params) {
      names.insert(p.name);
      total += p.numel();
      const bool is_weight = p.shape.size() == 2;
      CHECK_MESSAGE(p.decay == is_weight, p.name);
    }
  const int64_t d = 8, f = 12, v = 11, t = 6;
  const int64_t per_block = 4 * d + 3 * d * d + 3 * d + d * d + d + d * f + f + f * d + d;
  CHECK(total == v * d + t * d + 2 * per_block + 2 * d + d * v);
  CHECK(names.size() == 2 + 2 * gpt::block_param::count + gpt::head_param::count);
}

TEST_CASE("init is deterministic per element, whatever the chunking") {
  gpt::gpt_config c;  // default, larger sizes so the statistics mean something
  const auto mods = gpt::describe(c);
  const auto& qkv = mods[1].params[gpt::block_param::qkv_weight];
  std::vector<float> whole(qkv.numel());
  for (int64_t i = 0; i < qkv.numel(); ++i) whole[i] = gpt::init_value(qkv, i, 7);
  // Chunked as a 3-way shard with an odd chunk size would be: each piece alone.
  const int64_t chunk = (qkv.numel() + 2) / 3;
  for (int64_t start = 0; start < qkv.numel(); start += chunk)
    for (int64_t i = start; i < std::min(qkv.numel(), start + chunk); ++i)
      REQUIRE(gpt::init_value(qkv, i, 7) == whole[i]);
  CHECK(gpt::init_value(qkv, 5, 8) != whole[5]);
  CHECK(gpt::init_value(mods[2].params[gpt::block_param::qkv_weight], 5, 7) != whole[5]);

  auto std_of = [&](const gpt::param_desc& p) {
    double s2 = 0;  // about the known mean, 0
    for (int64_t i = 0; i < p.numel(); ++i) s2 += std::pow(gpt::init_value(p, i, 7), 2);
    return std::sqrt(s2 / static_cast<double>(p.numel()));
  };
  CHECK(std_of(qkv) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(std_of(mods[1].params[gpt::block_param::mlp_proj_weight]) ==
        doctest::Approx(0.02 / std::sqrt(2.0 * c.n_layers)).epsilon(0.05));
  CHECK(gpt::init_value(mods[1].params[gpt::block_param::ln1_gain], 3, 7) == 1.0f);
  CHECK(gpt::init_value(mods[1].params[gpt::block_param::qkv_bias], 3, 7) == 0.0f);
  CHECK_THROWS_AS(gpt::init_value(qkv, qkv.numel(), 7), std::out_of_range);

  const gpt::plain_model<float> m(c, 7);
  CHECK(m.block(0).values[gpt::block_param::qkv_weight] == whole);
}

TEST_CASE("gradient check: embed") {
  auto [c, desc, p] = layer_check(0, 2);
  const int B = 2, T = 5;
  const auto tokens = random_tokens(B * T, c.vocab, 3);
  const mat<double> r = random_mat(B * T, c.d_model, 4);
  gpt::embed_cache<double> cache;
  mat<double> x;
  gpt::embed_forward(c, p, tokens, B, T, cache, x);
  gpt::embed_backward(c, p, cache, r);
  const auto f = [&] {
    gpt::embed_forward(c, p, tokens, B, T, cache, x);
    return dot(x, r);
  };
  grad_checker g;
  std::vector<std::size_t> used;  // elements of rows that tokens select (others have zero grad)
  for (int32_t t : tokens)
    for (int j = 0; j < c.d_model; ++j) used.push_back(static_cast<std::size_t>(t * c.d_model + j));
  g.check(p.values[0], p.grads[0], f, "embed.token", 8, used);
  g.check(p.values[1], p.grads[1], f, "embed.position", 8);
  // Unused token rows and positions past T get nothing.
  CHECK(p.grads[1][static_cast<std::size_t>(5 * c.d_model)] == 0.0);
  MESSAGE("embed: " << g.checked << " elements, worst relative error " << g.worst);
}

TEST_CASE("gradient check: block (every parameter and the input)") {
  auto [c, desc, p] = layer_check(1, 5);
  const int B = 2, T = 5;
  mat<double> x = random_mat(B * T, c.d_model, 6);
  const mat<double> r = random_mat(B * T, c.d_model, 7);
  gpt::block_cache<double> cache;
  mat<double> y, dx;
  gpt::block_forward(c, p, x, B, T, cache, y);
  gpt::block_backward(c, p, cache, r, dx);
  const auto f = [&] {
    gpt::block_cache<double> probe;
    gpt::block_forward(c, p, x, B, T, probe, y);
    return dot(y, r);
  };
  grad_checker().check_layer(p, desc, x, dx, f, "block");
}

TEST_CASE("gradient check: head (every parameter and the input)") {
  auto [c, desc, p] = layer_check(3, 8);
  const int n = 7;
  mat<double> x = random_mat(n, c.d_model, 9);
  const mat<double> r = random_mat(n, c.vocab, 10);
  gpt::head_cache<double> cache;
  mat<double> logits, dx;
  gpt::head_forward(c, p, x, cache, logits);
  gpt::head_backward(c, p, cache, r, dx);
  const auto f = [&] {
    gpt::head_forward(c, p, x, cache, logits);
    return dot(logits, r);
  };
  grad_checker().check_layer(p, desc, x, dx, f, "head");
}

TEST_CASE("gradient check: cross-entropy (mean over tokens, scaled)") {
  const int n = 9, v = 11;
  mat<double> logits = random_mat(n, v, 11, 2.0);
  const auto targets = random_tokens(n, v, 12);
  gpt::cross_entropy_cache<double> cache;
  const double loss = gpt::cross_entropy_forward<double>(logits, targets, cache);
  double direct = 0;
  for (int i = 0; i < n; ++i) {
    const double lse = std::log(logits.row(i).array().exp().sum());
    direct += lse - logits(i, targets[static_cast<std::size_t>(i)]);
  }
  CHECK(loss == doctest::Approx(direct / n).epsilon(1e-12));
  const mat<double> dlogits = gpt::cross_entropy_backward(cache, 0.5);
  const auto f = [&] {
    gpt::cross_entropy_cache<double> probe;
    return 0.5 * gpt::cross_entropy_forward<double>(logits, targets, probe);
  };
  grad_checker().check_elements(logits.data(), dlogits.data(), logits.size(), 20, f, "dlogits");
  CHECK_THROWS_AS(gpt::cross_entropy_forward<double>(logits, random_tokens(n, v + 5, 1), cache), std::out_of_range);
}

TEST_CASE("gradient check: whole model through plain_model::forward_backward") {
  const auto c = tiny_config();
  gpt::plain_model<double> m(c, 13);
  for (std::size_t i = 0; i < m.modules.size(); ++i) randomise(m.modules[i], m.desc[i], 100 + i);
  const int B = 2, T = 6;
  const auto tokens = random_tokens(B * T, c.vocab, 14), targets = random_tokens(B * T, c.vocab, 15);
  gpt::model_workspace<double> ws;
  gpt::forward_backward(m, tokens, targets, B, T, ws);
  const auto f = [&] {
    gpt::model_workspace<double> probe;
    return gpt::forward_loss(m, tokens, targets, B, T, probe);
  };
  grad_checker g;
  for (std::size_t i = 0; i < m.modules.size(); ++i)
    for (std::size_t k = 0; k < m.desc[i].params.size(); ++k)
      if (m.desc[i].params[k].name != "embed.token")  // sparse rows: covered by the embed check
        g.check(m.modules[i].values[k], m.modules[i].grads[k], f, m.desc[i].params[k].name, 2);
  MESSAGE("model: " << g.checked << " elements, worst relative error " << g.worst);
}

TEST_CASE("backward accumulates: running it twice doubles every gradient") {
  const auto c = tiny_config();
  gpt::plain_model<double> m(c, 21);
  for (std::size_t i = 0; i < m.modules.size(); ++i) randomise(m.modules[i], m.desc[i], 200 + i);
  const int B = 2, T = 4;
  const auto tokens = random_tokens(B * T, c.vocab, 22);
  const mat<double> r = random_mat(B * T, c.d_model, 23);
  gpt::embed_cache<double> ec;
  gpt::block_cache<double> bc;
  gpt::head_cache<double> hc;
  mat<double> x, y, logits, dx1, dx2, dh1, dh2;
  gpt::embed_forward(c, m.embed(), tokens, B, T, ec, x);
  gpt::block_forward(c, m.block(0), x, B, T, bc, y);
  gpt::head_forward(c, m.head(), y, hc, logits);
  const mat<double> rl = random_mat(logits.rows(), logits.cols(), 24);

  gpt::embed_backward(c, m.embed(), ec, r);
  gpt::block_backward(c, m.block(0), bc, r, dx1);
  gpt::head_backward(c, m.head(), hc, rl, dh1);
  const auto once = m.modules;
  gpt::embed_backward(c, m.embed(), ec, r);
  gpt::block_backward(c, m.block(0), bc, r, dx2);
  gpt::head_backward(c, m.head(), hc, rl, dh2);
  CHECK(dx1 == dx2);  // input gradients are assigned, not accumulated
  CHECK(dh1 == dh2);
  for (std::size_t i : {0, 1, 3})
    for (std::size_t k = 0; k < once[i].grads.size(); ++k)
      for (std::size_t e = 0; e < once[i].grads[k].size(); ++e)
        REQUIRE(m.modules[i].grads[k][e] == doctest::Approx(2 * once[i].grads[k][e]).epsilon(1e-12));
}

TEST_CASE("recompute (activation checkpointing) reproduces the cache; in-place use is safe") {
  const auto c = tiny_config();
  gpt::plain_model<double> m(c, 31);
  for (std::size_t i = 0; i < m.modules.size(); ++i) randomise(m.modules[i], m.desc[i], 300 + i);
  const int B = 2, T = 5;
  const mat<double> x1 = random_mat(B * T, c.d_model, 32), x2 = random_mat(B * T, c.d_model, 33);
  const mat<double> dy = random_mat(B * T, c.d_model, 34);

  gpt::block_cache<double> direct;
  mat<double> y_direct, dx_direct;
  gpt::block_forward(c, m.block(0), x1, B, T, direct, y_direct);
  gpt::block_backward(c, m.block(0), direct, dy, dx_direct);
  const auto grads_direct = m.block(0).grads;
  m.block(0).zero_grad();

  // One cache shared by every block: block1's forward overwrites it, and block0's
  // recompute rebuilds it before block0's backward.
  gpt::block_cache<double> shared;
  mat<double> y, dx;
  gpt::block_forward(c, m.block(0), x1, B, T, shared, y);
  const double* qkv_storage = shared.qkv.data();
  const double* att_storage = shared.att.data();
  gpt::block_forward(c, m.block(1), x2, B, T, shared, y);
  gpt::block_forward(c, m.block(0), x1, B, T, shared, y);  // the recompute
  CHECK(shared.qkv.data() == qkv_storage);                 // reused, not reallocated
  CHECK(shared.att.data() == att_storage);
  CHECK(y == y_direct);
  gpt::block_backward(c, m.block(0), shared, dy, dx);
  CHECK(dx == dx_direct);
  CHECK(m.block(0).grads == grads_direct);

  CHECK(shared.saved_bytes() == gpt::block_activation_bytes<double>(c, B, T));
  CHECK(shared.scratch_bytes() > 0);

  // y may alias x, dx may alias dy.
  mat<double> z = x1;
  gpt::block_forward(c, m.block(0), z, B, T, shared, z);
  CHECK(z == y_direct);
  mat<double> g = dy;
  m.block(0).zero_grad();
  gpt::block_backward(c, m.block(0), shared, g, g);
  CHECK(g == dx_direct);
  CHECK(m.block(0).grads == grads_direct);
}

static_assert(!gpt::param_writer<const gpt::plain_params<float>&, float>,
              "backward must not accept read-only parameters");

TEST_CASE("modules reject bad shapes and tokens with clear errors") {
  const auto c = tiny_config();
  gpt::plain_model<double> m(c, 41);
  gpt::block_cache<double> bc;
  mat<double> y;
  CHECK_THROWS_WITH_AS(gpt::block_forward(c, m.block(0), mat<double>::Zero(9, 8), 2, 5, bc, y),
                       doctest::Contains("expected [10, 8]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gpt::block_forward(c, m.block(0), mat<double>::Zero(14, 8), 2, 7, bc, y),
                       doctest::Contains("seq_len"), std::invalid_argument);
  CHECK_THROWS_AS(gpt::block_backward(c, m.block(0), bc, mat<double>::Zero(10, 8), y), std::invalid_argument);
  gpt::embed_cache<double> ec;
  const std::vector<int32_t> bad{0, 1, 11, 2};
  CHECK_THROWS_AS(gpt::embed_forward(c, m.embed(), bad, 1, 4, ec, y), std::out_of_range);
}

TEST_CASE("float and double models agree at init") {
  auto c = tiny_config();
  const gpt::plain_model<float> mf(c, 51);
  const gpt::plain_model<double> md(c, 51);
  const auto tokens = random_tokens(12, c.vocab, 52), targets = random_tokens(12, c.vocab, 53);
  gpt::model_workspace<float> wf;
  gpt::model_workspace<double> wd;
  const double lf = gpt::forward_loss(mf, tokens, targets, 2, 6, wf);
  const double ld = gpt::forward_loss(md, tokens, targets, 2, 6, wd);
  CHECK(lf == doctest::Approx(ld).epsilon(1e-5));
  CHECK(ld == doctest::Approx(std::log(11.0)).epsilon(0.02));  // near-uniform at init
}

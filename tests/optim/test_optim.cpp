// Optimizer pieces against independent float64 references: AdamW over several steps, the loss
// scaler's state machine, the clipping coefficient and the host norm accumulator.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/optim/adamw.hpp"
#include "zshard/optim/grad_clip.hpp"
#include "zshard/optim/loss_scaler.hpp"

using namespace zshard;
using namespace zshard::optim;

namespace {

// Runs f and checks that it throws a zshard::error of the given kind with a how-to-fix hint.
template <class F>
void check_throws_kind(F&& f, error_kind kind) {
  bool thrown = false;
  try {
    f();
  } catch (const error& e) {
    thrown = true;
    CHECK(e.kind() == kind);
    CHECK(!e.hint().empty());
  }
  CHECK(thrown);
}

// AdamW as the paper and torch.optim.AdamW write it, in float64, written independently of
// the header: the hyper-parameters are the config's floats widened to double.
struct adamw_reference {
  std::vector<double> p, m, v;

  void step(const adamw_config& c, int t, const std::vector<float>& grad, float grad_scale, bool decay) {
    const double lr = c.lr, b1 = c.beta1, b2 = c.beta2, eps = c.eps;
    const double wd = decay ? double(c.weight_decay) : 0.0;
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double g = double(grad[i]) * double(grad_scale);
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      const double m_hat = m[i] / bc1, v_hat = v[i] / bc2;
      p[i] = p[i] - lr * wd * p[i] - lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

std::vector<float> random_floats(std::mt19937& rng, std::size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = normal(rng) * scale;
  return x;
}

// Gradients whose magnitudes spread over 10^-6 .. 10^1 so that eps, tiny and large second
// moments are all exercised; `raw_scale` models a loss-scaled, micro-batch-summed gradient.
std::vector<float> random_grads(std::mt19937& rng, std::size_t n, float raw_scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 1.0f);
  std::vector<float> g(n);
  for (auto& e : g) e = normal(rng) * std::pow(10.0f, exponent(rng)) * raw_scale;
  return g;
}

// max() that lets a NaN win, so a NaN error fails the check instead of being skipped.
double worse(double worst, double e) { return e <= worst ? worst : e; }

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& x) {
  std::vector<std::uint16_t> b(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) b[i] = x[i].bits;
  return b;
}

struct adamw_case {
  bool decay;
  float grad_scale;  // what the update multiplies by; raw gradients are 1/grad_scale larger
  dtype working;
  bool write_back;
};

// Ten AdamW steps in f32 through adamw_update_scalar against the float64 reference.
//
// Tolerance, |f32 - f64| <= 2e-6 * |p| + 5e-8 for master params: every step rounds p, m and v a
// handful of times at 2^-24 relative (~6e-8), so after 10 steps the f32 state is within ~20 ulps
// (~1.2e-6) of exact in the worst case; random rounding makes it ~6e-7 in practice (measured).
// A parameter that ends near zero keeps the absolute error it picked up while it was larger
// (|p| moves by up to ~lr per step) plus ten lr-sized updates each good to a few ulps: about
// ulp(0.1) * a few ~ 1e-8 (measured 9e-9), hence the absolute term. v sums positive terms and is
// compared relatively at 2e-6. m can cancel towards zero, so its error is measured against the
// largest |g| seen (the size of the terms that were summed), also at 2e-6. Real bugs (eps inside
// the sqrt, a missing bias correction, decay after the update) show up at 1e-4 or far above.
void run_adamw_case(const adamw_case& k) {
  constexpr std::size_t n = 1037;  // not a multiple of any vector width: exercises the tail
  constexpr int steps = 10;
  adamw_config cfg;
  cfg.lr = 1e-2f;  // large enough that the update, not just decay, moves p visibly
  cfg.weight_decay = 0.1f;
  std::mt19937 rng(1234);

  std::vector<float> master = random_floats(rng, n, 1.0f), m(n, 0.0f), v(n, 0.0f);
  adamw_reference ref{std::vector<double>(master.begin(), master.end()), std::vector<double>(n, 0.0),
                      std::vector<double>(n, 0.0)};
  std::vector<float> out_f32(n);
  std::vector<bf16> out_bf16(n);
  std::vector<f16> out_f16(n);
  void* out = nullptr;
  if (k.write_back) {
    out = k.working == dtype::f32 ? static_cast<void*>(out_f32.data())
          : k.working == dtype::bf16 ? static_cast<void*>(out_bf16.data())
                                     : static_cast<void*>(out_f16.data());
  }

  double max_g = 0.0;
  for (int t = 1; t <= steps; ++t) {
    const std::vector<float> grad = random_grads(rng, n, 1.0f / k.grad_scale);
    for (float g : grad) max_g = std::max(max_g, std::fabs(double(g) * double(k.grad_scale)));
    const adamw_step s = make_adamw_step(cfg, t, k.grad_scale, k.decay);
    adamw_update_scalar(s, master.data(), m.data(), v.data(), grad.data(), n, out, k.working);
    ref.step(cfg, t, grad, k.grad_scale, k.decay);

    if (k.write_back) {  // the working copy is exactly the rounded master, every step
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (k.working == dtype::f32) mismatches += std::memcmp(&out_f32[i], &master[i], 4) != 0;
        if (k.working == dtype::bf16) mismatches += !(out_bf16[i] == to_bf16(master[i]));
        if (k.working == dtype::f16) mismatches += !(out_f16[i] == to_f16(master[i]));
      }
      CHECK(mismatches == 0);
    }
  }

  // |a - b| <= 2e-6 * |b| + 5e-8 for p, written as one ratio so the worst case can be printed.
  double worst_p = 0, worst_m = 0, worst_v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst_p = worse(worst_p, std::fabs(master[i] - ref.p[i]) / (std::fabs(ref.p[i]) + 5e-8 / 2e-6));
    worst_m = worse(worst_m, std::fabs(m[i] - ref.m[i]) / max_g);
    worst_v = worse(worst_v, std::fabs(v[i] - ref.v[i]) / std::max(ref.v[i], 1e-300));
  }
  INFO("worst relative error: p " << worst_p << ", m " << worst_m << ", v " << worst_v);
  CHECK(worst_p <= 2e-6);
  CHECK(worst_m <= 2e-6);
  CHECK(worst_v <= 2e-6);
}

}  // namespace

TEST_CASE("adamw: ten steps match a float64 reference, every option and working dtype") {
  for (bool decay : {true, false}) {
    for (float grad_scale : {1.0f, 1.0f / (4.0f * 65536.0f), 0.37f}) {
      CAPTURE(decay);
      CAPTURE(grad_scale);
      run_adamw_case({decay, grad_scale, dtype::f32, false});
      for (dtype w : {dtype::f32, dtype::bf16, dtype::f16}) {
        CAPTURE(to_string(w));
        run_adamw_case({decay, grad_scale, w, true});
      }
    }
  }
}

TEST_CASE("adamw: writing the working copy does not change master or moments") {
  constexpr std::size_t n = 301;
  std::mt19937 rng(7);
  const std::vector<float> p0 = random_floats(rng, n, 2.0f);
  const std::vector<float> grad = random_grads(rng, n, 1.0f);
  const adamw_step s = make_adamw_step(adamw_config{}, 3, 0.5f, true);
  auto run = [&](void* out, dtype w) {
    std::vector<float> p = p0, m(n, 0.01f), v(n, 0.02f);
    adamw_update_scalar(s, p.data(), m.data(), v.data(), grad.data(), n, out, w);
    p.insert(p.end(), m.begin(), m.end());
    p.insert(p.end(), v.begin(), v.end());
    return p;
  };
  const std::vector<float> plain = run(nullptr, dtype::bf16);
  std::vector<float> o32(n);
  std::vector<bf16> ob(n);
  std::vector<f16> oh(n);
  CHECK(std::memcmp(run(o32.data(), dtype::f32).data(), plain.data(), plain.size() * 4) == 0);
  CHECK(std::memcmp(run(ob.data(), dtype::bf16).data(), plain.data(), plain.size() * 4) == 0);
  CHECK(std::memcmp(run(oh.data(), dtype::f16).data(), plain.data(), plain.size() * 4) == 0);
  CHECK(bits_of(ob) != std::vector<std::uint16_t>(n, 0));  // something was written
}

TEST_CASE("adamw: the first step moves every parameter by lr against the gradient's sign") {
  // At t = 1, m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps) ~ lr * sign(g):
  // a closed form that catches a missing or misapplied bias correction.
  adamw_config cfg;
  cfg.lr = 0.05f;
  cfg.weight_decay = 0.2f;
  std::vector<float> p{1.0f, -2.0f, 0.5f, 3.0f}, m(4, 0.0f), v(4, 0.0f);
  const std::vector<float> g{4.0f, -8.0f, 1e-3f, -2.0f};  // raw; grad_scale halves them
  adamw_update_scalar(make_adamw_step(cfg, 1, 0.5f, true), p.data(), m.data(), v.data(), g.data(), 4, nullptr,
                      dtype::f32);
  const double p0[4] = {1.0, -2.0, 0.5, 3.0};
  for (int i = 0; i < 4; ++i) {
    const double gi = 0.5 * g[i];
    const double expect = p0[i] * (1.0 - 0.05 * 0.2) - 0.05 * gi / (std::fabs(gi) + 1e-8);
    CHECK(p[i] == doctest::Approx(expect).epsilon(1e-6));
  }
}

TEST_CASE("adamw: make_adamw_step resolves bias corrections, decay and checks its inputs") {
  adamw_config cfg;
  cfg.weight_decay = 0.05f;
  const adamw_step s = make_adamw_step(cfg, 5, 0.25f, true);
  CHECK(s.lr == cfg.lr);
  CHECK(s.beta1 == cfg.beta1);
  CHECK(s.beta2 == cfg.beta2);
  CHECK(s.eps == cfg.eps);
  CHECK(s.weight_decay == 0.05f);
  CHECK(s.grad_scale == 0.25f);
  CHECK(s.bias_correction1 == float(1.0 - std::pow(double(cfg.beta1), 5)));
  CHECK(s.bias_correction2 == float(1.0 - std::pow(double(cfg.beta2), 5)));
  CHECK(make_adamw_step(cfg, 5, 0.25f, false).weight_decay == 0.0f);
  CHECK(make_adamw_step(cfg, 1'000'000, 1.0f, true).bias_correction2 == 1.0f);

  check_throws_kind([&] { make_adamw_step(cfg, 0, 1.0f, true); }, error_kind::usage);
  check_throws_kind([&] { make_adamw_step(cfg, 1, std::numeric_limits<float>::infinity(), true); },
                    error_kind::usage);
  check_throws_kind([&] { make_adamw_step(cfg, 1, std::nanf(""), true); }, error_kind::usage);
  check_throws_kind([&] { make_adamw_step(cfg, 1, -1.0f, true); }, error_kind::usage);
  cfg.lr = -1.0f;
  check_throws_kind([&] { make_adamw_step(cfg, 1, 1.0f, true); }, error_kind::config);
}

TEST_CASE("adamw_config: validation names bad values as configuration errors") {
  CHECK_NOTHROW(adamw_config{}.validate());
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  auto bad = [](auto edit) {
    adamw_config c;
    edit(c);
    check_throws_kind([&] { c.validate(); }, error_kind::config);
  };
  bad([](adamw_config& c) { c.lr = 0.0f; });
  bad([](adamw_config& c) { c.lr = -1e-3f; });
  bad([&](adamw_config& c) { c.lr = inf; });
  bad([&](adamw_config& c) { c.lr = nan; });
  bad([](adamw_config& c) { c.beta1 = 1.0f; });
  bad([](adamw_config& c) { c.beta1 = -0.1f; });
  bad([&](adamw_config& c) { c.beta1 = nan; });
  bad([](adamw_config& c) { c.beta2 = 1.0f; });
  bad([](adamw_config& c) { c.beta2 = -0.5f; });
  bad([](adamw_config& c) { c.eps = 0.0f; });
  bad([](adamw_config& c) { c.eps = -1e-8f; });
  bad([&](adamw_config& c) { c.eps = nan; });
  bad([](adamw_config& c) { c.weight_decay = -0.01f; });
  bad([&](adamw_config& c) { c.weight_decay = inf; });
  // Edges that are valid: beta 0 (no averaging) and no weight decay.
  adamw_config edge;
  edge.beta1 = 0.0f;
  edge.beta2 = 0.0f;
  edge.weight_decay = 0.0f;
  CHECK_NOTHROW(edge.validate());
}

// ---- loss scaling ----------------------------------------------------------------------------

namespace {
loss_scale_config dynamic_scaling(float initial_scale, int growth_interval) {
  loss_scale_config cfg;
  cfg.enabled = true;
  cfg.initial_scale = initial_scale;
  cfg.growth_interval = growth_interval;
  return cfg;
}
}  // namespace

TEST_CASE("loss_scaler: disabled keeps scale 1 but still counts skipped steps") {
  loss_scaler ls(loss_scale_config{});
  CHECK(!ls.enabled());
  CHECK(ls.scale() == 1.0f);
  ls.update(true);
  CHECK(ls.scale() == 1.0f);
  CHECK(ls.skipped_steps() == 1);
  for (int i = 0; i < 5000; ++i) ls.update(false);
  CHECK(ls.scale() == 1.0f);
  CHECK(ls.good_steps_in_row() == 5000);
}

TEST_CASE("loss_scaler: backoff on overflow, floor at min_scale, growth after the interval") {
  loss_scale_config cfg = dynamic_scaling(1024.0f, 3);
  cfg.min_scale = 200.0f;
  loss_scaler ls(cfg);
  CHECK(ls.scale() == 1024.0f);

  ls.update(true);  // backoff
  CHECK(ls.scale() == 512.0f);
  CHECK(ls.skipped_steps() == 1);
  ls.update(true);
  CHECK(ls.scale() == 256.0f);
  ls.update(true);  // 128 would be below the floor: clamp
  CHECK(ls.scale() == 200.0f);
  CHECK(ls.overflows_at_min_scale() == 0);
  ls.update(true);  // already at the floor: keep it, count it
  CHECK(ls.scale() == 200.0f);
  CHECK(ls.overflows_at_min_scale() == 1);
  CHECK(ls.skipped_steps() == 4);

  ls.update(false);
  ls.update(false);
  CHECK(ls.good_steps_in_row() == 2);
  CHECK(ls.scale() == 200.0f);
  ls.update(true);  // an overflow restarts the run of good steps
  CHECK(ls.good_steps_in_row() == 0);
  CHECK(ls.scale() == 200.0f);
  CHECK(ls.overflows_at_min_scale() == 2);
  ls.update(false);
  ls.update(false);
  CHECK(ls.scale() == 200.0f);  // only two good steps since the overflow
  ls.update(false);
  CHECK(ls.scale() == 400.0f);  // third in a row: grow, restart the count
  CHECK(ls.good_steps_in_row() == 0);
  for (int i = 0; i < 3; ++i) ls.update(false);
  CHECK(ls.scale() == 800.0f);
  CHECK(ls.skipped_steps() == 5);
}

TEST_CASE("loss_scaler: growth stops short of infinity") {
  loss_scaler ls(dynamic_scaling(std::ldexp(1.0f, 127), 1));
  ls.update(false);
  CHECK(ls.scale() == std::ldexp(1.0f, 127));
  CHECK(std::isfinite(ls.scale()));
}

TEST_CASE("loss_scaler: state round-trips for checkpoints") {
  loss_scale_config cfg;
  cfg.enabled = true;
  cfg.growth_interval = 10;
  loss_scaler a(cfg);
  a.update(true);
  a.update(false);
  a.update(false);
  loss_scaler b(cfg);
  b.restore(a.state());
  CHECK(b.scale() == a.scale());
  CHECK(b.skipped_steps() == 1);
  CHECK(b.good_steps_in_row() == 2);
  for (int i = 0; i < 8; ++i) b.update(false);
  CHECK(b.scale() == 2.0f * a.scale());
  check_throws_kind([&] { b.restore(loss_scaler_state{0.0f, 0, 0, 0}); }, error_kind::config);
  check_throws_kind([&] { b.restore(loss_scaler_state{1.0f, -1, 0, 0}); }, error_kind::config);
}

TEST_CASE("loss_scale_config: validation names bad values as configuration errors") {
  CHECK_NOTHROW(loss_scale_config{}.validate());
  auto bad = [](auto edit) {
    loss_scale_config c;
    c.enabled = true;
    edit(c);
    check_throws_kind([&] { c.validate(); }, error_kind::config);
    check_throws_kind([&] { loss_scaler{c}; }, error_kind::config);
  };
  bad([](loss_scale_config& c) { c.initial_scale = 0.0f; });
  bad([](loss_scale_config& c) { c.initial_scale = std::numeric_limits<float>::infinity(); });
  bad([](loss_scale_config& c) { c.initial_scale = 0.5f; });  // below min_scale = 1
  bad([](loss_scale_config& c) { c.growth_factor = 1.0f; });
  bad([](loss_scale_config& c) { c.growth_factor = std::nanf(""); });
  bad([](loss_scale_config& c) { c.backoff_factor = 1.0f; });
  bad([](loss_scale_config& c) { c.backoff_factor = 0.0f; });
  bad([](loss_scale_config& c) { c.growth_interval = 0; });
  bad([](loss_scale_config& c) { c.min_scale = 0.0f; });
  bad([](loss_scale_config& c) { c.min_scale = -1.0f; });
}

// ---- clipping --------------------------------------------------------------------------------

TEST_CASE("clip_coefficient: clipped gradients have norm max_norm, short ones are untouched") {
  std::mt19937 rng(99);
  for (float size : {1e-3f, 0.1f, 1.0f, 30.0f}) {
    const std::vector<float> g = random_floats(rng, 513, size);
    double ss = 0;
    for (float x : g) ss += double(x) * double(x);
    const double norm = std::sqrt(ss);
    for (double max_norm : {0.01, 1.0, 100.0}) {
      CAPTURE(size);
      CAPTURE(max_norm);
      const double c = clip_coefficient(norm, max_norm);
      CHECK(c == std::min(1.0, max_norm / (norm + 1e-6)));
      double clipped = 0;
      for (float x : g) clipped += (double(x) * c) * (double(x) * c);
      if (norm > max_norm) {
        CHECK(std::sqrt(clipped) == doctest::Approx(max_norm * norm / (norm + 1e-6)).epsilon(1e-12));
        CHECK(std::sqrt(clipped) <= max_norm);
      } else {
        CHECK(c == 1.0);
      }
    }
  }
}

TEST_CASE("clip_coefficient: edge cases") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(clip_coefficient(5.0, 0.0) == 1.0);  // clipping off
  CHECK(clip_coefficient(5.0, -1.0) == 1.0);
  CHECK(clip_coefficient(inf, 0.0) == 1.0);
  CHECK(clip_coefficient(0.0, 1.0) == 1.0);  // zero norm: no division by zero
  CHECK(clip_coefficient(1.0, 1.0) < 1.0);   // the 1e-6 makes an exact match clip slightly
  CHECK(clip_coefficient(1.0, 1.0) == doctest::Approx(1.0 / (1.0 + 1e-6)).epsilon(1e-15));
  CHECK(clip_coefficient(inf, 1.0) == 0.0);
  CHECK(std::isnan(clip_coefficient(std::nan(""), 1.0)));
  check_throws_kind([] { clip_coefficient(-1.0, 1.0); }, error_kind::usage);
}

TEST_CASE("norm_accumulator: matches a float64 sum over pieces of every length") {
  std::mt19937 rng(5);
  const std::vector<float> g = random_grads(rng, 10007, 1.0f);
  const float scale = 0.37f;
  long double ref = 0;
  for (float x : g) ref += (static_cast<long double>(x) * scale) * (static_cast<long double>(x) * scale);

  norm_accumulator acc;
  std::size_t at = 0;
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{5},
                          std::size_t{1000}, std::size_t{7}}) {
    acc.add(g.data() + at, len, scale);
    at += len;
  }
  acc.add(g.data() + at, g.size() - at, scale);
  CHECK(!acc.nonfinite);
  // Positive terms only: double summation is within n * 2^-53 ~ 1.1e-12 relative of exact.
  CHECK(acc.sum_squares == doctest::Approx(double(ref)).epsilon(2e-12));
  CHECK(acc.norm() == doctest::Approx(std::sqrt(double(ref))).epsilon(2e-12));

  // The largest float squared still fits in double: no false overflow.
  norm_accumulator big;
  const float fmax = std::numeric_limits<float>::max();
  const std::vector<float> huge(9, fmax);
  big.add(huge.data(), huge.size(), 2.0f);
  CHECK(!big.nonfinite);
  CHECK(big.sum_squares == doctest::Approx(9.0 * 4.0 * double(fmax) * double(fmax)).epsilon(1e-15));
}

TEST_CASE("norm_accumulator: flags inf, -inf and NaN anywhere, and the flag sticks") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {inf, -inf, nan}) {
    for (std::size_t where : {std::size_t{0}, std::size_t{5}, std::size_t{17}, std::size_t{18}}) {
      CAPTURE(bad);
      CAPTURE(where);
      std::vector<float> g(19, 0.5f);  // 19: four blocks of four plus a tail of three
      g[where] = bad;
      norm_accumulator acc;
      acc.add(g.data(), g.size(), 1.0f);
      CHECK(acc.nonfinite);
      const std::vector<float> fine(8, 1.0f);
      acc.add(fine.data(), fine.size(), 1.0f);
      CHECK(acc.nonfinite);
    }
    norm_accumulator zero_scale;  // inf * 0 is NaN: still flagged
    zero_scale.add(&bad, 1, 0.0f);
    CHECK(zero_scale.nonfinite);
  }
  norm_accumulator bad_scale;
  const float one = 1.0f;
  bad_scale.add(&one, 1, inf);
  CHECK(bad_scale.nonfinite);
  norm_accumulator empty;
  empty.add(nullptr, 0, nan);  // nothing added, nothing to flag
  CHECK(!empty.nonfinite);
  CHECK(empty.sum_squares == 0.0);
}

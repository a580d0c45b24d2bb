// The backend-generic GPT (examples/gpt/ops_model.hpp) on the CPU: each operation its CUDA
// kernel runs (gpt_math.hpp's functions, through host_ops.hpp's loops) against the Eigen layers
// in float64, at sizes that are not multiples of anything; the GEMM helper against cuBLAS's
// contract in every transpose; the whole model in f32 against the Eigen model; and 50 training
// steps through the engine in the GPU's mixed precision against the Eigen model's run.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "../../examples/gpt/gpt_model.hpp"
#include "../../examples/gpt/ops_plan.hpp"
#include "gpt_eigen_reference.hpp"
#include "zshard/testing/plan_check.hpp"

namespace {

using idx = gpt::index;
using hops = gpt::host_ops<float>;
template <class S>
using mat = gpt::mat<S>;

std::vector<float> random_vec(std::size_t n, double sd, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}
mat<double> as_mat(const std::vector<float>& v, idx rows, idx cols) {
  mat<double> m(rows, cols);
  for (idx i = 0; i < m.size(); ++i) m.data()[i] = double(v[std::size_t(i)]);
  return m;
}
// max |got - want| / max |want|: the error relative to the tensor's scale.
double rel_err(const float* got, const double* want, std::size_t n) {
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}
double rel_err(const std::vector<float>& got, const mat<double>& want) {
  REQUIRE(got.size() == std::size_t(want.size()));
  return rel_err(got.data(), want.data(), got.size());
}

}  // namespace

TEST_CASE("gpt_math: bf16 storage rounds as zshard::to_bf16, loads as to_float") {
  std::mt19937 rng(3);
  std::vector<float> v = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, 3.4e38f, -1e-40f,
                          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i < 100'000; ++i) v.push_back(std::bit_cast<float>(std::uint32_t(rng())));
  for (float f : v) {
    REQUIRE(gpt::math::store<zshard::bf16>(f).bits == zshard::to_bf16(f).bits);
    const zshard::bf16 h{static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16)};
    REQUIRE(std::bit_cast<std::uint32_t>(gpt::math::load(h)) == std::bit_cast<std::uint32_t>(zshard::to_float(h)));
  }
}

TEST_CASE("gpt_math: GELU forward and backward against the Eigen layer in float64, tails included") {
  const auto x = random_vec(1001, 3.0, 5);
  const auto up = random_vec(1001, 1.0, 6);
  mat<double> u = as_mat(x, 1, 1001), y, du = as_mat(up, 1, 1001);
  gpt::layers::gelu_forward<double>(u, y);
  gpt::layers::gelu_backward<double>(u, du);
  double ey = 0, ed = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ey = std::max(ey, std::abs(double(gpt::math::gelu_forward(x[i])) - y(0, idx(i))) / (1 + std::abs(y(0, idx(i)))));
    ed = std::max(ed, std::abs(double(gpt::math::gelu_backward(x[i], up[i])) - du(0, idx(i))) /
                          (1 + std::abs(du(0, idx(i)))));
  }
  CHECK(ey < 1e-6);
  CHECK(ed < 1e-6);
  CHECK(std::abs(gpt::math::gelu_forward(-100.0f)) < 1e-30f);  // saturated: no NaN from exp overflow
  CHECK(std::isfinite(gpt::math::gelu_backward(-100.0f, 1.0f)));
}

TEST_CASE("host_ops: layer norm forward, backward and parameter gradients against float64, odd sizes") {
  for (auto [rows, d] : {std::pair{1, 1}, {5, 37}, {131, 17}, {3, 300}}) {
    INFO("rows " << rows << " d " << d);
    const auto x = random_vec(std::size_t(rows * d), 2.0, 7), dy = random_vec(std::size_t(rows * d), 1.0, 8);
    auto g = random_vec(std::size_t(d), 1.0, 9), b = random_vec(std::size_t(d), 1.0, 10);
    hops o;
    std::vector<float> y(x.size()), mean(static_cast<std::size_t>(rows)), rstd(static_cast<std::size_t>(rows)), dx(x.size(), 0.5f);
    std::vector<float> dg(std::size_t(d), 0.25f), db(std::size_t(d), -0.25f), scratch(10'000);
    o.col_scratch = scratch.data();
    o.layer_norm_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, d);
    o.layer_norm_backward(dy.data(), x.data(), mean.data(), rstd.data(), g.data(), dx.data(), rows, d);
    o.layer_norm_param_grad(dy.data(), x.data(), mean.data(), rstd.data(), dg.data(), db.data(), rows, d);

    mat<double> xhat, yw, dxw(rows, d);
    gpt::col_vec<double> r;
    gpt::layers::layer_norm_stats<double>(as_mat(x, rows, d), xhat, r);
    const mat<double> gd = as_mat(g, 1, d), bd = as_mat(b, 1, d);
    gpt::layers::layer_norm_apply<double>(xhat, gd.data(), bd.data(), yw);
    dxw.setConstant(0.5);
    mat<double> dgw(1, d), dbw(1, d);
    dgw.setConstant(0.25);
    dbw.setConstant(-0.25);
    gpt::layers::layer_norm_backward<double>(as_mat(dy, rows, d), xhat, r, gd.data(), dgw.data(), dbw.data(), dxw);
    if (d > 1) {  // d == 1: xhat is 0, y is the bias and the gradient through x vanishes
      CHECK(rel_err(y, yw) < 1e-5);
      CHECK(rel_err(dx, dxw) < 1e-4);
      CHECK(rel_err(dg, dgw) < 1e-5);
    }
    CHECK(rel_err(db, dbw) < 1e-5);
  }
}

TEST_CASE("host_ops: column sums (bias gradients) by chunks, rows not a multiple of the chunk") {
  for (int rows : {1, 127, 128, 129, 300}) {
    const int cols = 7;
    const auto dy = random_vec(std::size_t(rows * cols), 1.0, 11);
    hops o;
    std::vector<float> scratch(gpt::ops::column_sum_scratch_floats(rows, cols)), db(std::size_t(cols), 1.0f);
    o.col_scratch = scratch.data();
    o.bias_grad(dy.data(), db.data(), rows, cols);
    for (int j = 0; j < cols; ++j) {
      double want = 1.0;
      for (int r = 0; r < rows; ++r) want += double(dy[std::size_t(r * cols + j)]);
      CHECK(std::abs(double(db[std::size_t(j)]) - want) < 1e-5 * (1 + std::abs(want)));
    }
  }
}

TEST_CASE("ops::matmul: row-major products through cuBLAS's column-major contract, every transpose, batched") {
  const int M = 5, N = 7, K = 3, batch = 2;
  const auto a = random_vec(std::size_t(batch * M * K), 1.0, 12), b = random_vec(std::size_t(batch * K * N), 1.0, 13);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> c = random_vec(std::size_t(batch * M * N), 1.0, 14);
        const std::vector<float> c0 = c;
        hops o;
        gpt::ops::matmul(o, M, N, K, a.data(), ta, b.data(), tb, c.data(), beta, {M * K, K * N, M * N, batch});
        for (int i = 0; i < batch; ++i)
          for (int r = 0; r < M; ++r)
            for (int col = 0; col < N; ++col) {
              double want = beta * double(c0[std::size_t(i * M * N + r * N + col)]);
              for (int l = 0; l < K; ++l) {
                const float av = ta ? a[std::size_t(i * M * K + l * M + r)] : a[std::size_t(i * M * K + r * K + l)];
                const float bv = tb ? b[std::size_t(i * K * N + col * K + l)] : b[std::size_t(i * K * N + l * N + col)];
                want += double(av) * double(bv);
              }
              REQUIRE(std::abs(double(c[std::size_t(i * M * N + r * N + col)]) - want) < 1e-5);
            }
      }
}

TEST_CASE("host_ops: softmax cross-entropy (one pass, then the gradient) against float64, odd vocabulary") {
  const int rows = 11, vocab = 37;
  auto logits = random_vec(std::size_t(rows * vocab), 3.0, 17);
  for (int j = 0; j < vocab; ++j) logits[std::size_t(2 * vocab + j)] = float(j) * 9.0f - 150.0f;  // max last: the sum rescaled at every step
  logits[std::size_t(3 * vocab + 5)] = 88.0f;                                                    // exp(88) alone is near f32's limit
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) targets[std::size_t(r)] = (r * 7) % vocab;
  hops o;
  std::vector<float> loss(static_cast<std::size_t>(rows)), dl(logits.size());
  const float scale = 0.5f;
  o.cross_entropy(logits.data(), targets.data(), loss.data(), dl.data(), scale / rows, rows, vocab);
  gpt::cross_entropy_cache<double> cache;
  const double want = gpt::cross_entropy_forward<double>(as_mat(logits, rows, vocab), targets, cache);
  double got = 0;
  for (float l : loss) got += double(l);
  CHECK(std::abs(got / rows - want) < 1e-6 * want);
  const mat<double> dlw = gpt::cross_entropy_backward(cache, scale);
  CHECK(rel_err(dl, dlw) < 1e-5);
  o.cross_entropy(logits.data(), targets.data(), loss.data(), nullptr, 0.0f, rows, vocab);  // loss only
  double again = 0;
  for (float l : loss) again += double(l);
  CHECK(again == got);
}

TEST_CASE("host_ops: embedding forward and backward (repeated tokens, in row order) against the Eigen module") {
  const gpt::gpt_config c{.vocab = 9, .seq_len = 5, .d_model = 6, .n_heads = 2, .n_layers = 1, .d_ff = 4};
  const int B = 3, T = 5, N = B * T;
  const gpt::plain_model<double> ref(c, 77);
  const gpt::plain_model<float> ref_f(c, 77);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(N));
  for (int r = 0; r < N; ++r) tokens[std::size_t(r)] = (r * r + 3) % 4;  // 4 distinct tokens, repeated
  const auto dx = random_vec(std::size_t(N * c.d_model), 1.0, 18);
  gpt::embed_cache<double> cache;
  mat<double> x;
  gpt::embed_forward(c, ref.embed(), tokens, B, T, cache, x);
  gpt::plain_params<double> grads = ref.embed();
  grads.zero_grad();
  gpt::embed_backward(c, grads, cache, as_mat(dx, N, c.d_model));

  hops o;
  std::vector<float> xo(std::size_t(N * c.d_model));
  o.embed_forward(tokens.data(), ref_f.embed().param(0), ref_f.embed().param(1), xo.data(), B, T, c.d_model);
  CHECK(rel_err(xo, x) < 1e-6);
  // the model's counting sort: rows of each distinct token in row order, in chunks
  gpt::batch b{B, T, tokens, tokens};
  gpt::host_ops<float> arena_ops;
  gpt::ops_gpt<gpt::host_ops<float>> net(arena_ops, c, B, T, false);
  net.load_batch(b);
  std::vector<float> dwte(std::size_t(c.vocab * c.d_model)), dwpe(std::size_t(c.seq_len * c.d_model));
  o.embed_backward(net.token_chunks(), dx.data(), dwte.data(), dwpe.data(), B, T, c.d_model);
  CHECK(rel_err(dwte.data(), grads.grads[0].data(), dwte.size()) < 1e-6);
  CHECK(rel_err(dwpe.data(), grads.grads[1].data(), dwpe.size()) < 1e-6);
}

TEST_CASE("host_ops: the token embedding's gradient by bounded chunks: a token over several chunks, one at exactly one") {
  const gpt::gpt_config c{.vocab = 7, .seq_len = 200, .d_model = 5, .n_heads = 1, .n_layers = 1, .d_ff = 4};
  const int B = 3, T = 200, N = B * T, d = c.d_model;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(N));
  for (int r = 0; r < N; ++r) {  // spread over the batch: 300 rows of token 3, 128 of 5, 172 of three others
    const int k = (r * 37) % N;
    tokens[std::size_t(r)] = k < 300 ? 3 : k < 428 ? 5 : k % 3;
  }
  const auto dx = random_vec(std::size_t(N * d), 1.0, 19);
  gpt::host_ops<float> o;
  gpt::ops_gpt<gpt::host_ops<float>> net(o, c, B, T, false);
  net.load_batch(gpt::batch{B, T, tokens, tokens});
  const gpt::ops::token_chunks tc = net.token_chunks();
  CHECK(tc.multi == 1);                     // token 3: 300 rows in chunks of 128, 128, 44
  CHECK(tc.chunks == 3 + 1 + 3);            // token 5 (exactly a chunk) and the three small ones: one each
  for (int ch = 0; ch < tc.chunks; ++ch) CHECK(tc.chunk_begin[ch + 1] - tc.chunk_begin[ch] <= gpt::ops::embed_rows_per_chunk);
  std::vector<float> dwte(std::size_t(c.vocab * d), 0.5f), dwpe(std::size_t(T * d), -0.5f);
  o.embed_backward(tc, dx.data(), dwte.data(), dwpe.data(), B, T, d);
  for (int tok = 0; tok < c.vocab; ++tok)
    for (int j = 0; j < d; ++j) {
      double want = 0.5;
      for (int r = 0; r < N; ++r)
        if (tokens[std::size_t(r)] == tok) want += dx[std::size_t(r * d + j)];
      CHECK(std::abs(dwte[std::size_t(tok * d + j)] - want) < 1e-5 * (1 + std::abs(want)));
    }
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < d; ++j)
      CHECK(std::abs(dwpe[std::size_t(t * d + j)] - (-0.5 + dx[std::size_t(t * d + j)] + double(dx[std::size_t((T + t) * d + j)]) +
                                                    dx[std::size_t((2 * T + t) * d + j)])) < 1e-5);
}

namespace {

// A module's parameters as f32 (from plain_model<float>) with its own f32 gradients.
struct f32_params {
  const gpt::plain_params<float>* values;
  std::vector<std::vector<float>> grads;
  explicit f32_params(const gpt::plain_params<float>& v) : values(&v) {
    for (const auto& g : v.values) grads.emplace_back(g.size(), 0.0f);
  }
  const float* param(int k) const { return values->param(k); }
  float* grad(int k) { return grads[std::size_t(k)].data(); }
};

struct ops_pass {
  double loss = 0;
  std::vector<f32_params> params;
};

ops_pass run_ops_model(const gpt::plain_model<float>& m, const gpt::batch& b, bool checkpoint) {
  hops o;
  gpt::ops_gpt<hops> net(o, m.config, b.batch_size, b.seq_len, checkpoint);
  ops_pass out;
  for (const auto& mod : m.modules) out.params.emplace_back(mod);
  const int L = m.config.n_layers;
  net.load_batch(b);
  net.embed_forward(out.params[0]);
  for (int l = 0; l < L; ++l) net.block_forward(l, out.params[std::size_t(1 + l)]);
  net.head_forward(out.params[std::size_t(1 + L)], 1.0f / float(b.batch_size * b.seq_len));
  out.loss = net.mean_loss();
  net.head_backward(out.params[std::size_t(1 + L)]);
  for (int l = L; l-- > 0;) {
    if (checkpoint) net.block_forward(l, out.params[std::size_t(1 + l)]);
    net.block_backward(l, out.params[std::size_t(1 + l)]);
  }
  net.embed_backward(out.params[0]);
  return out;
}

}  // namespace

TEST_CASE("ops model in f32: loss and every gradient equal the Eigen model's (float64), checkpointing changes no bit") {
  const gpt::gpt_config c{.vocab = 41, .seq_len = 7, .d_model = 12, .n_heads = 3, .n_layers = 2, .d_ff = 20};
  const auto data = gpt::corpus::synthetic(5, c.vocab, 4096);
  const gpt::batch b = data.get_batch(3, 3, c.seq_len);
  gpt::plain_model<double> ref(c, 42);
  gpt::model_workspace<double> ws;
  const double want = gpt::forward_backward<double>(ref, b.tokens, b.targets, b.batch_size, b.seq_len, ws);
  const gpt::plain_model<float> mf(c, 42);
  const ops_pass got = run_ops_model(mf, b, false);
  CHECK(std::abs(got.loss - want) < 1e-5 * want);
  for (std::size_t m = 0; m < ref.modules.size(); ++m)
    for (std::size_t k = 0; k < ref.modules[m].grads.size(); ++k) {
      INFO(ref.desc[m].params[k].name);
      const auto& w = ref.modules[m].grads[k];
      CHECK(rel_err(got.params[m].grads[k].data(), w.data(), w.size()) < 2e-4);
    }
  const ops_pass ck = run_ops_model(mf, b, true);
  CHECK(ck.loss == got.loss);
  for (std::size_t m = 0; m < got.params.size(); ++m) CHECK(ck.params[m].grads == got.params[m].grads);
}

TEST_CASE("ops model through the engine, f32: 20 steps follow the Eigen model's run (f32 reassociation only)") {
  gpt_equivalence::setup s;
  s.steps = 20;
  s.param_dtype = zshard::dtype::f32;
  const auto eigen = gpt_equivalence::eigen_run(s);
  const auto ops = gpt_equivalence::host_ops_run<float>(s);
  const double gap = gpt_equivalence::max_relative_gap(ops.losses, eigen.losses);
  MESSAGE("f32 ops model vs Eigen model, 20 steps: largest relative loss gap " << gap);
  CHECK(gap < 1e-5);
  CHECK(gpt_equivalence::max_relative_gap(ops.grad_norms, eigen.grad_norms) < 1e-4);
  CHECK(eigen.losses.back() < eigen.losses.front());
}

// The GPU's mixed precision against the host's f32 math with the same bf16 weights, emulated
// on the CPU: gpt_ops_equivalence.hpp derives the tolerances.
TEST_CASE("ops model through the engine, bf16 matmul operands: 50 steps follow the Eigen bf16 run within tolerance") {
  gpt_equivalence::setup s;
  const auto eigen = gpt_equivalence::eigen_run(s);
  const auto ops = gpt_equivalence::host_ops_run<zshard::bf16>(s);
  REQUIRE(eigen.losses.size() == 50);
  const double first = std::abs(ops.losses[0] - eigen.losses[0]) / eigen.losses[0];
  const double gap = gpt_equivalence::max_relative_gap(ops.losses, eigen.losses);
  MESSAGE("bf16 ops model vs Eigen bf16 model: step 1 relative gap " << first << " (bound "
          << gpt_equivalence::first_step_tolerance(s) << "), 50 steps " << gap << " (loss " << eigen.losses.front()
          << " -> " << eigen.losses.back() << ")");
  CHECK(first < gpt_equivalence::first_step_tolerance(s));
  CHECK(gap < gpt_equivalence::trajectory_tolerance / 2);  // the GPU adds up to same_rounding_trajectory
  CHECK(ops.losses.back() < 0.7 * ops.losses.front());     // and it trains
}

TEST_CASE("plain_trainer (weights resident) equals the engine at world 1, bit for bit, and checkpointing too") {
  gpt_equivalence::setup s;
  s.steps = 6;
  s.param_dtype = zshard::dtype::f32;
  s.checkpoint = false;
  const auto engine_run = gpt_equivalence::host_ops_run<float>(s).losses;
  s.checkpoint = true;
  CHECK(gpt_equivalence::host_ops_run<float>(s).losses == engine_run);
  const auto data = s.data();
  const auto model = gpt::make_zshard_model(s.model, s.seed);
  zshard::host_backend backend;
  hops o;
  gpt::ops_gpt<hops> net(o, s.model, s.batch, s.model.seq_len, false);
  gpt::plain_trainer<zshard::host_backend, hops> plain(backend, model, s.seed, net, s.engine().adamw, s.clip,
                                                       backend.make_stream());
  std::vector<double> losses;
  for (int step = 0; step < s.steps; ++step) {
    plain.train_step({s.batch_of(data, step)});
    losses.push_back(net.mean_loss());
  }
  CHECK(losses == engine_run);
}

TEST_CASE("the ops runner's recorded schedule plans its run: every ledger category within the plan, 2 ranks") {
  using hops16 = gpt::host_ops<zshard::bf16>;
  gpt::gpu_run_options o;
  o.model = {.vocab = 48, .seq_len = 8, .d_model = 24, .n_heads = 3, .n_layers = 3, .d_ff = 40};
  o.batch = 2;  // per rank
  o.eval_every = 2;
  for (bool checkpoint : {true, false}) {
    o.checkpoint = checkpoint;
    const auto model = gpt::make_zshard_model(o.model, o.seed);
    const auto cfg = gpt::engine_config_for(o);
    const auto plan = gpt::plan_for<hops16>(model, cfg, 2, o, zshard::plan::device_overheads::none());
    const auto data = gpt::corpus::synthetic(o.seed, o.model.vocab, 4096);
    const std::size_t arena = gpt::ops_gpt<hops16>::arena_bytes(o.model, o.batch, o.model.seq_len, checkpoint);
    zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
      using engine_t = zshard::engine<zshard::host_backend, zshard::thread_comm, gpt::gpu_policies>;
      zshard::host_backend backend;
      engine_t eng(backend, comm, model.spec, cfg);
      hops16 ops;
      gpt::ops_gpt<hops16> net(ops, o.model, o.batch, o.model.seq_len, checkpoint);
      gpt::ops_engine_runner<engine_t, hops16> runner(eng, model, &net, net.arena_bytes(), checkpoint);
      for (int step = 1; step <= 5; ++step) {
        runner.train_micro_batch(data.get_rows(std::uint64_t(step), comm.rank() * o.batch, o.batch, o.model.seq_len));
        eng.step();
        if (step % o.eval_every == 0) runner.evaluate(data.get_rows(999, comm.rank() * o.batch, o.batch, o.model.seq_len));
      }
      CHECK(net.arena_bytes() == arena);
      CHECK(backend.ledger().peak(zshard::mem_category::activations) == arena);
      CHECK(plan.device.peak_of(zshard::mem_category::activations) == arena);  // what the plan charges
      ZSHARD_CHECK_PEAK_WITHIN_PLAN(backend.ledger(), plan.device);
    });
  }
}

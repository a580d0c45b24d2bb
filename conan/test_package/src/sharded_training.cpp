// A small sharded training loop, as a user of the installed package writes it: a two-layer
// linear model fitted to a fixed linear teacher on 2 thread ranks (ZeRO-3 on the host backend),
// Eigen for the math, zshard's doctest checks at every step boundary. zshard's testing header
// comes before doctest on purpose: the ZSHARD_CHECK_* macros work in either order.
#include <zshard/testing/invariants.hpp>
#include <zshard/zshard.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <Eigen/Dense>
#include <cmath>
#include <random>

namespace {
using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using cmap = Eigen::Map<const matrix>;
using map = Eigen::Map<matrix>;
constexpr int in = 8, hidden = 16, out = 2, rows = 32;

// Each rank draws its own rows of the same global batch; the teacher is fixed.
void batch(int step, int rank, matrix& x, matrix& y) {
  std::mt19937 rng(std::uint32_t(1000 * step + rank));
  std::normal_distribution<float> n(0.0f, 1.0f);
  x.resize(rows, in);
  for (int i = 0; i < x.size(); ++i) x.data()[i] = n(rng);
  matrix teacher(in, out);
  for (int i = 0; i < teacher.size(); ++i) teacher.data()[i] = std::sin(float(i));
  y = x * teacher;
}
}  // namespace

TEST_CASE("a two-layer model trains sharded over 2 ranks and its loss falls") {
  zshard::model_spec spec;
  const auto w1 = spec.add_param("l1.w", {in, hidden});
  const auto w2 = spec.add_param("l2.w", {hidden, out});
  const auto l1 = spec.add_module("l1", {w1}), l2 = spec.add_module("l2", {w2});
  zshard::engine_config cfg;
  cfg.adamw.lr = 1e-2f;
  cfg.adamw.weight_decay = 0.0f;

  std::vector<double> first(2), last(2);
  zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, cfg);
    matrix x, y, h, pred;
    for (int step = 0; step < 200; ++step) {
      batch(step, comm.rank(), x, y);
      {
        auto g = eng.forward(l1);
        h = x * cmap(g.param_data<float>(0), in, hidden);
      }
      {
        auto g = eng.forward(l2);
        pred = h * cmap(g.param_data<float>(0), hidden, out);
      }
      const matrix dpred = (pred - y) * (2.0f / float(pred.size()));  // d(mean squared error)
      const double loss = (pred - y).squaredNorm() / double(pred.size());
      if (step == 0) first[std::size_t(comm.rank())] = loss;
      last[std::size_t(comm.rank())] = loss;
      eng.begin_backward();
      matrix dh;
      {
        auto g = eng.backward(l2);
        map(g.grad_data(0), hidden, out) += h.transpose() * dpred;
        dh = dpred * cmap(g.param_data<float>(0), hidden, out).transpose();
      }
      {
        auto g = eng.backward(l1);
        map(g.grad_data(0), in, hidden) += x.transpose() * dh;
      }
      eng.end_backward();
      eng.step();
      ZSHARD_CHECK_STEP_INVARIANTS(eng);
      ZSHARD_CHECK_MEMORY_BOUNDS(eng);
    }
  });
  for (int r = 0; r < 2; ++r) {
    MESSAGE("rank " << r << ": loss " << first[std::size_t(r)] << " -> " << last[std::size_t(r)]);
    CHECK(last[std::size_t(r)] < 0.05 * first[std::size_t(r)]);
  }
}

// The example's vectorised GELU against the closed form in float64: forward and derivative,
// across the saturated tails, the chunk boundaries and sizes that are not a chunk multiple.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "../../examples/gpt/gpt_layers.hpp"

namespace {

double gelu64(double x) {
  const double c = std::sqrt(2.0 / M_PI), a = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(c * (x + a * x * x * x)));
}
double gelu64_prime(double x) {
  const double c = std::sqrt(2.0 / M_PI), a = 0.044715;
  const double t = std::tanh(c * (x + a * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x);
}

template <class S>
void check_against_float64(int rows, int cols, std::uint32_t seed, double tol) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 3.0);  // reaches far into both tails
  std::uniform_real_distribution<double> upstream(-2.0, 2.0);
  gpt::mat<S> u(rows, cols), y, du(rows, cols);
  for (gpt::index i = 0; i < u.size(); ++i) {
    u.data()[i] = static_cast<S>(normal(rng));
    du.data()[i] = static_cast<S>(upstream(rng));
  }
  u(0, 0) = S(0);
  if (u.size() > 2) {
    u.data()[1] = S(-30);  // tanh saturates to -1: gelu -> 0, derivative -> 0
    u.data()[2] = S(30);
  }
  const gpt::mat<S> dy = du;
  gpt::layers::gelu_forward<S>(u, y);
  gpt::layers::gelu_backward<S>(u, du);
  REQUIRE(y.rows() == rows);
  REQUIRE(y.cols() == cols);
  double worst_y = 0, worst_d = 0;
  for (gpt::index i = 0; i < u.size(); ++i) {
    const double x = double(u.data()[i]);
    const double ey = std::abs(double(y.data()[i]) - gelu64(x)) / (1.0 + std::abs(gelu64(x)));
    const double want_d = gelu64_prime(x) * double(dy.data()[i]);
    const double ed = std::abs(double(du.data()[i]) - want_d) / (1.0 + std::abs(want_d));
    worst_y = std::max(worst_y, ey);
    worst_d = std::max(worst_d, ed);
  }
  INFO("rows " << rows << " cols " << cols << ": worst forward error " << worst_y << ", backward " << worst_d);
  CHECK(worst_y < tol);
  CHECK(worst_d < tol);
}

}  // namespace

TEST_CASE("GELU forward and backward match float64, float and double, any size") {
  for (auto [r, c] : {std::pair{1, 1}, {3, 5}, {1, 255}, {1, 256}, {1, 257}, {16, 512}, {7, 333}}) {
    check_against_float64<float>(r, c, 11u + std::uint32_t(r * c), 4e-7);
    check_against_float64<double>(r, c, 29u + std::uint32_t(r * c), 1e-12);
  }
}

TEST_CASE("GELU backward is in place on the upstream gradient and leaves u alone") {
  gpt::mat<float> u(2, 300), du(2, 300);
  u.setRandom();
  du.setConstant(1.0f);
  const gpt::mat<float> u0 = u;
  gpt::layers::gelu_backward<float>(u, du);
  CHECK(u == u0);
  for (gpt::index i = 0; i < u.size(); ++i)
    REQUIRE(std::abs(double(du.data()[i]) - gelu64_prime(double(u.data()[i]))) < 2e-6);
}

// The GPT example's data and training, alone (no engine): the corpus is deterministic, in range
// and batched with targets shifted by one, a text file is read as bytes (missing or short files
// say so), and a tiny model actually learns the synthetic language.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../../examples/gpt/corpus.hpp"
#include "../../examples/gpt/gpt_model.hpp"

TEST_CASE("corpus: deterministic, in range, and targets are the inputs shifted by one") {
  const auto a = gpt::corpus::synthetic(5, 64, 20000), b = gpt::corpus::synthetic(5, 64, 20000);
  const auto other = gpt::corpus::synthetic(6, 64, 20000);
  REQUIRE(a.size() == 20000);
  CHECK(std::equal(a.tokens().begin(), a.tokens().end(), b.tokens().begin()));
  CHECK(!std::equal(a.tokens().begin(), a.tokens().end(), other.tokens().begin()));
  CHECK(std::all_of(a.tokens().begin(), a.tokens().end(), [](int32_t t) { return t >= 0 && t < 64; }));
  // Counting sentences count: a digit after "count" or a digit is the next digit, or ".".
  const auto tok = a.tokens();
  constexpr int d0 = gpt::synthetic_language::digit0;
  for (std::size_t i = 1; i + 1 < tok.size(); ++i)
    if (tok[i] >= d0 && tok[i] < d0 + 10 && tok[i + 1] != gpt::synthetic_language::period)
      REQUIRE(tok[i + 1] == d0 + (tok[i] - d0 + 1) % 10);

  const int B = 4, T = 16;
  const auto g1 = a.get_batch(3, B, T), g2 = b.get_batch(3, B, T), g3 = a.get_batch(4, B, T);
  CHECK(g1.tokens == g2.tokens);
  CHECK(g1.targets == g2.targets);
  CHECK(g1.tokens != g3.tokens);
  for (int r = 0; r < B; ++r) {
    for (int t = 0; t + 1 < T; ++t) CHECK(g1.targets[r * T + t] == g1.tokens[r * T + t + 1]);
    const std::size_t s = a.window_start(3, r, T);
    CHECK(g1.targets[r * T + T - 1] == tok[s + T]);
  }
  // A rank fetching only its rows gets exactly its slice of the global batch.
  const auto mine = a.get_rows(3, 2, 2, T), sliced = g1.slice(2, 2);
  CHECK(mine.tokens == sliced.tokens);
  CHECK(mine.targets == sliced.targets);
  CHECK(mine.batch_size == 2);
  CHECK_THROWS_AS(g1.slice(3, 2), std::out_of_range);
  CHECK_THROWS_AS(gpt::synthetic_language(16), std::invalid_argument);
}

TEST_CASE("corpus: a text file is read as bytes; missing or short files say so") {
  const auto dir = std::filesystem::temp_directory_path();
  const auto path =
      (dir / ("zshard_gpt_corpus_" + std::to_string(std::hash<std::string>{}(__FILE__)) + ".txt")).string();
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello, zshard\xff";
  }
  const auto c = gpt::corpus::from_file(path, 8);
  CHECK(c.vocab() == 256);
  REQUIRE(c.size() == 14);
  CHECK(c.tokens()[0] == 'h');
  CHECK(c.tokens()[13] == 255);
  const auto bt = c.get_batch(0, 3, 8);
  CHECK(bt.tokens.size() == 24);
  CHECK_THROWS_WITH_AS(gpt::corpus::from_file(path, 64), doctest::Contains("need at least 65"), std::runtime_error);
  CHECK_THROWS_AS(c.get_batch(0, 1, 14), std::invalid_argument);
  std::filesystem::remove(path);
  CHECK_THROWS_WITH_AS(gpt::corpus::from_file(path, 8), doctest::Contains("cannot open"), std::runtime_error);
}

TEST_CASE("a tiny model learns the synthetic language: 30 Adam steps cut the loss by > 30%") {
  const gpt::gpt_config c{.vocab = 64, .seq_len = 16, .d_model = 32, .n_heads = 4, .n_layers = 2, .d_ff = 64};
  const auto data = gpt::corpus::synthetic(1, c.vocab, 1 << 16);
  gpt::plain_model<float> m(c, 1);
  gpt::model_workspace<float> ws;

  // Plain Adam, inline: this checks the model and data, not zshard's optimizer.
  auto mean = m.modules, var = m.modules;  // same shapes; only .values are used
  for (auto* s : {&mean, &var})
    for (auto& mod : *s)
      for (auto& v : mod.values) std::fill(v.begin(), v.end(), 0.0f);
  constexpr float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.99f, eps = 1e-8f;

  std::vector<double> losses;
  const int B = 16, T = 16;
  for (int step = 1; step <= 30; ++step) {
    const auto bt = data.get_batch(static_cast<uint64_t>(step), B, T);
    m.zero_grad();
    losses.push_back(gpt::forward_backward(m, bt.tokens, bt.targets, B, T, ws));
    const float c1 = 1 - std::pow(beta1, static_cast<float>(step));
    const float c2 = 1 - std::pow(beta2, static_cast<float>(step));
    for (std::size_t i = 0; i < m.modules.size(); ++i)
      for (std::size_t k = 0; k < m.modules[i].values.size(); ++k) {
        auto &v = m.modules[i].values[k], &mv = mean[i].values[k], &vv = var[i].values[k];
        const auto& g = m.modules[i].grads[k];
        for (std::size_t e = 0; e < v.size(); ++e) {
          mv[e] = beta1 * mv[e] + (1 - beta1) * g[e];
          vv[e] = beta2 * vv[e] + (1 - beta2) * g[e] * g[e];
          v[e] -= lr * (mv[e] / c1) / (std::sqrt(vv[e] / c2) + eps);
        }
      }
  }
  std::string curve;
  for (double l : losses) curve += std::to_string(l).substr(0, 5) + " ";
  MESSAGE("loss curve: " << curve);
  CHECK(losses.front() == doctest::Approx(std::log(64.0)).epsilon(0.03));
  double tail = 0;
  for (std::size_t i = losses.size() - 5; i < losses.size(); ++i) tail += losses[i] / 5;
  CHECK(tail < 0.7 * losses.front());
  CHECK(losses.back() < 0.7 * losses.front());
}

// The memory ledger against closed-form sums: current, peak per category, total peak and the
// per-category breakdown at the total peak; budget errors that name everything and change nothing.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "../support/error_capture.hpp"
#include "zshard/core/memory_ledger.hpp"

using namespace zshard;

TEST_CASE("ledger: current and peak follow a random sequence of charges and releases") {
  std::mt19937 rng(42);
  memory_ledger ledger("device");
  std::array<std::size_t, mem_category_count> cur{}, peak{};
  std::size_t total = 0, total_peak = 0;
  std::vector<std::pair<mem_category, std::size_t>> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 3) {
      const auto c = static_cast<mem_category>(rng() % mem_category_count);
      const std::size_t bytes = rng() % 100000;
      ledger.charge(c, bytes);
      live.emplace_back(c, bytes);
      cur[std::size_t(c)] += bytes;
      peak[std::size_t(c)] = std::max(peak[std::size_t(c)], cur[std::size_t(c)]);
      total += bytes;
      total_peak = std::max(total_peak, total);
    } else {
      const std::size_t k = rng() % live.size();
      auto [c, bytes] = live[k];
      live.erase(live.begin() + std::ptrdiff_t(k));
      ledger.release(c, bytes);
      cur[std::size_t(c)] -= bytes;
      total -= bytes;
    }
    REQUIRE(ledger.total_current() == total);
  }
  for (std::size_t c = 0; c < mem_category_count; ++c) {
    CHECK(ledger.current(mem_category(c)) == cur[c]);
    CHECK(ledger.peak(mem_category(c)) == peak[c]);
  }
  CHECK(ledger.total_peak() == total_peak);
}

TEST_CASE("ledger: breakdown at total peak and peak reset") {
  memory_ledger ledger;
  ledger.charge(mem_category::gathered_params, 100);
  ledger.charge(mem_category::grad_buckets, 50);  // total peak 150 here
  ledger.release(mem_category::gathered_params, 100);
  ledger.charge(mem_category::scratch, 20);
  CHECK(ledger.total_peak() == 150);
  CHECK(ledger.at_total_peak(mem_category::gathered_params) == 100);
  CHECK(ledger.at_total_peak(mem_category::scratch) == 0);
  ledger.reset_peaks();
  CHECK(ledger.total_peak() == 70);
  CHECK(ledger.peak(mem_category::gathered_params) == 0);
  CHECK(ledger.report().find("grad_buckets: current 50 B") != std::string::npos);
}

TEST_CASE("ledger: a request over budget throws a budget error naming category, request, budget and usage") {
  memory_ledger ledger("rank3 device", 1000);
  ledger.charge(mem_category::sharded_params, 600);
  ledger.charge(mem_category::gathered_params, 300);
  const error e = test_support::thrown_by([&] { ledger.charge(mem_category::grad_buckets, 200); });
  CHECK(e.kind() == error_kind::budget);
  const std::string what = e.what();
  CHECK(what.find("rank3 device") != std::string::npos);
  CHECK(what.find("grad_buckets") != std::string::npos);
  CHECK(what.find("request of 200 bytes") != std::string::npos);
  CHECK(what.find("budget of 1000 bytes") != std::string::npos);
  CHECK(what.find("in use 900 bytes") != std::string::npos);
  CHECK(!e.hint().empty());
  // nothing changed
  CHECK(ledger.total_current() == 900);
  CHECK(ledger.current(mem_category::grad_buckets) == 0);
  CHECK(ledger.total_peak() == 900);
  // exactly at the budget is allowed
  ledger.charge(mem_category::grad_buckets, 100);
  CHECK(ledger.total_current() == 1000);
}

TEST_CASE("ledger: releasing more than accounted is an invariant error") {
  memory_ledger ledger;
  ledger.charge(mem_category::scratch, 10);
  CHECK_THROWS_AS(ledger.release(mem_category::scratch, 11), error);
  CHECK(ledger.current(mem_category::scratch) == 10);
}

TEST_CASE("format_bytes picks a readable unit") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(80.0 * 1024 * 1024 * 1024) == "80.00 GiB");
}

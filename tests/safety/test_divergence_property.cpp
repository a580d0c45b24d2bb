// Issue 11, property: random pairs of per-rank schedules that diverge (different order, a
// skipped module, different routing to same-size experts, a different setting) on world 2..8,
// on a communicator with tags (threads) and one without (as NCCL): every one is reported and
// no rank's parameters change. Schedules that agree, drawn alongside, train.
#include <doctest/doctest.h>

#include <random>

#include "stack_model.hpp"

using namespace safety;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int cases_per_world = 3;  // sanitizers run the same paths, ten times slower
#else
constexpr int cases_per_world = 10;
#endif

constexpr int blocks = 3, experts = 3;

// b0, e?, b1, e?, b2, e?: a block then the expert its router picked.
std::vector<module_id> routed(std::mt19937_64& rng) {
  std::vector<module_id> f;
  for (int b = 0; b < blocks; ++b) {
    f.push_back(module_id(b));
    f.push_back(module_id(blocks + int(rng() % experts)));
  }
  return f;
}

enum class divergence { none, order, skip, routing, config };

const char* name(divergence d) {
  switch (d) {
    case divergence::none: return "none";
    case divergence::order: return "order";
    case divergence::skip: return "skipped module";
    case divergence::routing: return "routing";
    case divergence::config: return "config";
  }
  return "?";
}

void diverge(schedule& s, divergence d, std::mt19937_64& rng) {
  auto& f = s.forward;
  switch (d) {
    case divergence::none:
      return;
    case divergence::order: {
      std::size_t i;
      do i = rng() % (f.size() - 1);
      while (f[i] == f[i + 1]);
      std::swap(f[i], f[i + 1]);
      return;
    }
    case divergence::skip:
      f.erase(f.begin() + std::ptrdiff_t(rng() % f.size()));
      return;
    case divergence::routing: {
      const std::size_t i = 2 * (rng() % blocks) + 1;
      f[i] = module_id(blocks + (int(f[i]) - blocks + 1 + int(rng() % (experts - 1))) % experts);
      return;
    }
    case divergence::config:
      switch (rng() % 4) {
        case 0: s.cfg.prefetch.prefetch_numel = 200; break;
        case 1: s.cfg.reduce.reduce_bucket_numel = 500; break;
        case 2: s.cfg.prefetch.max_reuse_distance = 100; break;
        default: s.cfg.partition.shard_alignment_numel = 2; break;
      }
      return;
  }
}

}  // namespace

TEST_CASE("random diverging per-rank schedules on world 2..8: every one reported, none trains") {
  const model_spec spec = stack_spec(blocks, experts);
  std::mt19937_64 rng(20261203);
  int reported = 0, trained_ok = 0;
  for (int world = 2; world <= 8; ++world) {
    for (int c = 0; c < cases_per_world; ++c) {
      const auto d = divergence(rng() % 5);
      const bool tagged = rng() % 2 == 0;
      const auto base = routed(rng);
      std::vector<schedule> s(static_cast<std::size_t>(world));
      for (auto& x : s) x.forward = base;
      const int odd = int(rng() % std::uint64_t(world));
      diverge(s[std::size_t(odd)], d, rng);
      const outcome o = tagged ? run_schedules<true>(spec, s) : run_schedules<false>(spec, s);
      CAPTURE(world);
      CAPTURE(name(d));
      CAPTURE(tagged);
      CAPTURE(odd);
      CAPTURE(o.error.value_or("no error"));
      if (d == divergence::none) {
        CHECK_FALSE(o.error);
        for (int t : o.trained) CHECK(t == 1);
        ++trained_ok;
      } else {
        CHECK(o.error);
        for (int t : o.trained) CHECK(t == 0);
        ++reported;
      }
    }
  }
  MESSAGE(reported << " diverging schedules reported, " << trained_ok << " agreeing ones trained");
  CHECK(reported > 0);
}

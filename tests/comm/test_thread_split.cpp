// split(color, key) on the thread and null communicators: the group's size and ranks follow
// MPI_Comm_split (color groups, ordered by key then parent rank), collectives inside a group
// equal a serial reference over its members, groups run concurrently, sizes do not divide by
// the group size, and a failure anywhere aborts the groups too.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "../support/early_return.hpp"
#include "../support/split_rules.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/comm/thread_comm.hpp"

using namespace zshard;

namespace {

static_assert(splittable<thread_comm> && splittable<null_comm>);

std::vector<float> values(int parent_rank, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed * 131u + static_cast<std::uint32_t>(parent_rank));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}


}  // namespace

TEST_CASE("thread_comm split: groups as MPI_Comm_split, collectives equal a serial reference") {
  for (int world : {1, 2, 5, 8}) {
    for (const test_support::split_rule& rl : test_support::split_rules) {
      std::mutex mu;
      std::vector<std::string> failures;
      run_ranks(world, [&](thread_comm& comm) {
        const int r = comm.rank();
        auto fail = [&](const std::string& m) {
          std::lock_guard lk(mu);
          failures.push_back("rank " + std::to_string(r) + ": " + m);
        };
        const auto members = test_support::split_members(rl, r, world);
        thread_comm sub = comm.split(rl.color(r, world), rl.key(r, world));
        if (sub.size() != static_cast<int>(members.size())) fail("group size");
        if (members[static_cast<std::size_t>(sub.rank())].second != r) fail("group rank");
        const std::size_t n = 1001, gn = members.size(), me = static_cast<std::size_t>(sub.rank());
        const std::size_t block = shard_count(n, sub.size());
        // all_reduce over the group, in the group's rank order
        std::vector<float> mine = values(r, n, 1), got(n), want(n, 0.f);
        sub.all_reduce(mine.data(), got.data(), n, dtype::f32, reduce_op::sum);
        for (const auto& m : members) {
          const auto v = values(m.second, n, 1);
          for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
        }
        if (std::memcmp(got.data(), want.data(), n * sizeof(float)) != 0) fail("all_reduce");
        // reduce_scatter (average) and all_gather of blocks that do not divide n
        std::vector<float> grad = values(r, block * gn, 2), shard(block), full(block * gn);
        sub.reduce_scatter(grad.data(), shard.data(), block, dtype::f32, reduce_op::average);
        for (std::size_t i = 0; i < block; ++i) {
          float acc = 0;
          for (const auto& m : members) acc += values(m.second, block * gn, 2)[me * block + i];
          if (shard[i] != acc / static_cast<float>(gn)) {
            fail("reduce_scatter element " + std::to_string(i));
            break;
          }
        }
        sub.all_gather(mine.data(), full.data(), block, dtype::f32);
        for (std::size_t g = 0; g < gn; ++g)
          if (std::memcmp(full.data() + g * block, values(members[g].second, n, 1).data(), block * sizeof(float)))
            fail("all_gather block " + std::to_string(g));
        comm.barrier();  // the parent is still usable after its groups ran
      });
      INFO(rl.name, ", world ", world);
      CHECK(failures.empty());
      for (const auto& f : failures) MESSAGE(f);
    }
  }
}

TEST_CASE("thread_comm split: a failure on one rank aborts the other ranks' groups at once") {
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    run_ranks(
        4,
        [&](thread_comm& comm) {
          thread_comm sub = comm.split(comm.rank() % 2, 0);
          if (comm.rank() == 1) throw std::runtime_error("rank 1 fails on purpose");
          float x = 1;
          sub.all_reduce(&x, &x, 1, dtype::f32, reduce_op::sum);  // rank 3 waits for rank 1 here
        },
        std::chrono::seconds(60));
  } catch (const std::exception& e) {
    msg = e.what();
  }
  CHECK(msg == "rank 1 fails on purpose");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // not the 60 s timeout
}

// Issue 25 point 9: a rank whose run_ranks function returns is retired in every group it is in,
// nested splits included, so a peer waiting for it in a group fails at once, naming it by its
// rank in the world and in the group, as plain ranks of the world do.
TEST_CASE("thread_comm split: a rank that returns early fails its groups' waiting ranks at once, naming it") {
  for (bool nested : {false, true}) {
    const auto [msg, waited] = test_support::run_with_early_return("nested " + std::to_string(nested), [&] {
      run_ranks(
          4,
          [&](thread_comm& comm) {
            thread_comm pairs = comm.split(comm.rank() / 2, comm.rank());       // {0, 1}, {2, 3}
            thread_comm across = comm.split(comm.rank() % 2, comm.rank());      // {0, 2}, {1, 3}
            thread_comm inner = nested ? pairs.split(0, pairs.rank()) : pairs;  // the same pair, split again
            float x = 1, y[2];
            inner.all_gather(&x, y, 1, dtype::f32);
            if (comm.rank() == 1) return;  // ends its run without its last collectives
            if (comm.rank() == 0) inner.all_reduce(&x, &x, 1, dtype::f32, reduce_op::sum);   // waits for rank 1
            if (comm.rank() == 3) across.all_reduce(&x, &x, 1, dtype::f32, reduce_op::sum);  // waits for rank 1
            // rank 2 ends too: no collective of the whole world is left to catch rank 1's return
          },
          std::chrono::seconds(60));
    });
    INFO(msg);
    CHECK(msg.find("rank 1") != std::string::npos);
    CHECK(msg.find("returned from its run_ranks function") != std::string::npos);
    CHECK(waited < std::chrono::seconds(5));  // not the 60 s timeout
  }
}

TEST_CASE("split errors: a negative color, and a rank that does not call split") {
  CHECK_THROWS_WITH_AS(run_ranks(2, [](thread_comm& c) { (void)c.split(c.rank() == 1 ? -1 : 0, 0); }),
                       doctest::Contains("rank 1 passed color -1"), error);
  CHECK_THROWS_AS(run_ranks(
                      2,
                      [](thread_comm& c) {
                        if (c.rank() == 0)
                          (void)c.split(0, 0);
                        else
                          c.barrier();
                      },
                      std::chrono::milliseconds(2000)),
                  error);
}

TEST_CASE("null_comm split follows the rule every simulated rank uses") {
  null_comm c(5, 8);
  CHECK_THROWS_AS((void)c.split(1, 5), error);  // no rule: no peers to ask
  c.set_split_rule([](int q) { return std::pair{q / 4, q}; });
  const null_comm sub = c.split(1, 5);
  CHECK(sub.size() == 4);
  CHECK(sub.rank() == 1);
  CHECK_THROWS_AS((void)c.split(0, 5), error);  // not what the rule gives this rank
  c.set_split_rule([](int q) { return std::pair{q % 2, -q}; });
  const null_comm odd = c.split(1, -5);
  CHECK(odd.size() == 4);
  CHECK(odd.rank() == 1);  // odd ranks by descending rank: 7, 5, 3, 1
}

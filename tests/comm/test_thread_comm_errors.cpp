// The thread communicator's failure paths: a failing rank's error is what run_ranks rethrows and
// the other ranks stop instead of hanging; usage errors, timeouts and mismatched collectives are
// reported with named, specific messages; thread_world::abort stops a waiting rank and every
// later collective; bad arguments are usage errors raised before any communication.
// Rank threads only record what they got; every assertion runs on the test thread after join.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "zshard/comm/thread_comm.hpp"

using namespace zshard;
using namespace std::chrono_literals;

namespace {

struct caught {
  bool thrown = false;
  error_kind kind = error_kind::invariant;
  std::string what;
};
template <class F>
caught catch_error(F&& f) {
  caught c;
  try {
    f();
  } catch (const error& e) {
    c = {true, e.kind(), e.what()};
  } catch (const std::exception& e) {
    c = {true, error_kind::invariant, std::string("non-zshard: ") + e.what()};
  }
  return c;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a failing rank: run_ranks rethrows its error, the others stop instead of hanging") {
  std::vector<caught> seen(4);
  const auto t0 = std::chrono::steady_clock::now();
  const caught top = catch_error([&] {
    run_ranks(
        4,
        [&](thread_comm& c) {
          std::vector<float> v(8, 1.0f);
          c.all_reduce(v.data(), v.data(), v.size(), dtype::f32, reduce_op::sum);
          if (c.rank() == 2) throw std::runtime_error("boom in rank 2");
          seen[c.rank()] = catch_error([&] { c.all_reduce(v.data(), v.data(), v.size(), dtype::f32, reduce_op::sum); });
          if (seen[c.rank()].thrown) throw error(seen[c.rank()].kind, seen[c.rank()].what);
        },
        30s);
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // far below the 30 s timeout
  CHECK(top.thrown);
  CHECK(top.what == "non-zshard: boom in rank 2");  // the root cause, not a secondary error
  for (int r : {0, 1, 3}) {
    CHECK(seen[r].thrown);
    CHECK(seen[r].kind == error_kind::comm);
    CHECK(contains(seen[r].what, "rank 2 failed: boom in rank 2"));
    CHECK(contains(seen[r].what, "all_reduce on rank " + std::to_string(r)));
  }
}

TEST_CASE("a usage error on one rank is the error run_ranks reports") {
  const caught top = catch_error([] {
    run_ranks(
        3,
        [](thread_comm& c) {
          float x = 1.0f;
          c.broadcast(&x, 1, dtype::f32, c.rank() == 1 ? 7 : 0);  // rank 1 passes a bad root
        },
        30s);
  });
  CHECK(top.kind == error_kind::usage);
  CHECK(contains(top.what, "root 7"));
}

TEST_CASE("timeout: a rank that hangs stops the others with a named error") {
  const auto t0 = std::chrono::steady_clock::now();
  const caught top = catch_error([] {
    run_ranks(
        3,
        [](thread_comm& c) {
          float x = 1.0f;
          if (c.rank() == 1)
            std::this_thread::sleep_for(600ms);  // busy elsewhere (a rank that returns early is named at once)
          else
            c.all_reduce(&x, &x, 1, dtype::f32, reduce_op::sum);
        },
        200ms);
  });
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(elapsed >= 200ms);
  CHECK(elapsed < 5s);
  CHECK(top.kind == error_kind::comm);
  CHECK(contains(top.what, "all_reduce on rank "));
  // The root cause is whichever of ranks 0 and 2 timed out first; rank 1 is always missing.
  const std::string marker = "timed out after 200 ms waiting for rank(s) ";
  REQUIRE(contains(top.what, marker));
  const std::string missing = top.what.substr(top.what.find(marker) + marker.size());
  CHECK((missing.rfind("1 ", 0) == 0 || missing.rfind("1,", 0) == 0 || missing.rfind("0, 1", 0) == 0));
}

TEST_CASE("mismatched collectives are detected on every rank") {
  struct mismatch_case {
    const char* name;
    void (*call)(thread_comm&);
    const char* expect;
  };
  const mismatch_case cases[] = {
      {"dtype",
       [](thread_comm& c) {
         std::vector<float> v(4, 1.0f);
         c.all_reduce(v.data(), v.data(), 4, c.rank() == 0 ? dtype::f32 : dtype::bf16, reduce_op::sum);
       },
       "rank 1 called all_reduce(count=4, bf16, sum)"},
      {"count",
       [](thread_comm& c) {
         std::vector<float> v(8, 1.0f);
         c.all_reduce(v.data(), v.data(), c.rank() == 2 ? 8 : 4, dtype::f32, reduce_op::sum);
       },
       "rank 2 called all_reduce(count=8, f32, sum)"},
      {"op",
       [](thread_comm& c) {
         std::vector<float> v(4, 1.0f);
         c.all_reduce(v.data(), v.data(), 4, dtype::f32, c.rank() == 1 ? reduce_op::max : reduce_op::sum);
       },
       "rank 1 called all_reduce(count=4, f32, max)"},
      {"root",
       [](thread_comm& c) {
         float x = 0;
         c.broadcast(&x, 1, dtype::f32, c.rank() == 2 ? 1 : 0);
       },
       "rank 2 called broadcast(count=1, f32, root=1)"},
      {"kind",
       [](thread_comm& c) {
         float x = 0, y[3] = {};
         if (c.rank() == 1)
           c.barrier();
         else
           c.all_gather(&x, y, 1, dtype::f32);
       },
       "rank 1 called barrier as collective #0"},
      {"skipped call",
       [](thread_comm& c) {
         float x = 0;
         if (c.rank() != 1) c.barrier();  // rank 1 skips it and meets the others' broadcast
         c.broadcast(&x, 1, dtype::f32, 0);
       },
       "rank 1 called broadcast(count=1, f32, root=0) as collective #0"},
  };
  for (const auto& mc : cases) {
    CAPTURE(mc.name);
    std::vector<caught> seen(3);
    const caught top = catch_error([&] {
      run_ranks(
          3,
          [&](thread_comm& c) {
            seen[c.rank()] = catch_error([&] { mc.call(c); });
            if (seen[c.rank()].thrown) throw error(seen[c.rank()].kind, seen[c.rank()].what);
          },
          30s);
    });
    CHECK(top.kind == error_kind::comm);
    for (const caught& s : seen) {
      CHECK(s.thrown);
      CHECK(s.kind == error_kind::comm);
      CHECK(contains(s.what, "collective mismatch"));
      CHECK(contains(s.what, mc.expect));
    }
  }
}

TEST_CASE("thread_world::abort stops a waiting rank and every later collective") {
  thread_world world(2, 30s);
  caught waiting;
  std::thread t([&] { waiting = catch_error([&] { thread_comm(world, 0).barrier(); }); });
  std::this_thread::sleep_for(20ms);
  world.abort("operator pressed stop");
  t.join();
  CHECK(waiting.kind == error_kind::comm);
  CHECK(contains(waiting.what, "barrier on rank 0 aborted: operator pressed stop"));
  CHECK(world.aborted());
  CHECK(world.failed_rank() == -1);
  world.abort("a second reason is ignored", 1);
  CHECK(world.abort_reason() == "operator pressed stop");
  float x = 0;
  const caught later = catch_error([&] { thread_comm(world, 1).all_reduce(&x, &x, 1, dtype::f32, reduce_op::sum); });
  CHECK(later.kind == error_kind::comm);
  CHECK(contains(later.what, "all_reduce on rank 1 aborted"));
}

// The CI failure of 2026-12-05 (ASan heap-use-after-free in test_hybrid): an abort that lands
// while ranks copy from each other's buffers let the first rank to finish throw at the exit
// rendezvous and free its buffer while a slower peer still read it. Here each rank rewrites its
// source as soon as its collective throws: a peer that had not finished reading would copy the
// rewritten words. Three ranks on two cores make one rank fall behind in its copy; each trial
// aborts at a different moment.
TEST_CASE("an abort in the middle of a collective: no rank leaves while a peer still reads its buffer") {
  constexpr int ranks = 3;
  constexpr std::size_t words = std::size_t{1} << 18;  // 1 MiB per rank: the copy dominates
  constexpr std::uint32_t rewritten = 0xFFFFFFFFu;
  int leaked = 0;
  for (int trial = 0; trial < 24; ++trial) {
    thread_world world(ranks, 30s);
    std::vector<std::vector<std::uint32_t>> src(ranks), dst(ranks);
    std::vector<caught> got(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      src[r].assign(words, std::uint32_t(r + 1));
      dst[r].assign(words * ranks, 0);
      threads.emplace_back([&, r] {
        got[r] = catch_error([&] {
          for (;;) thread_comm(world, r).all_gather(src[r].data(), dst[r].data(), words, dtype::f32);
        });
        std::fill(src[r].begin(), src[r].end(), rewritten);  // reused at once, as a freed buffer would be
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300 + 97 * trial));
    world.abort("stopped mid-copy");
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) {
      CHECK(got[r].kind == error_kind::comm);
      leaked += std::count(dst[r].begin(), dst[r].end(), rewritten) > 0;
    }
  }
  CHECK(leaked == 0);  // no rank read a peer's buffer after that peer had left the collective
}

TEST_CASE("bad arguments are usage errors raised before any communication") {
  thread_world world(2);
  thread_comm c(world, 0);
  float buf[8] = {};
  CHECK(catch_error([] { thread_world w(0); }).kind == error_kind::usage);
  CHECK(catch_error([&] { thread_comm bad(world, 2); }).kind == error_kind::usage);
  CHECK(catch_error([&] { c.all_reduce(nullptr, buf, 1, dtype::f32, reduce_op::sum); }).kind == error_kind::usage);
  CHECK(catch_error([&] { c.all_gather(buf, nullptr, 1, dtype::f32); }).kind == error_kind::usage);
  CHECK(catch_error([&] { c.broadcast(buf, 1, dtype::f32, -1); }).kind == error_kind::usage);
  CHECK(catch_error([&] { c.reduce_scatter(buf, buf + 4, 2, dtype::f32, reduce_op::max); }).kind == error_kind::usage);
  // overlaps other than the documented in-place forms
  CHECK(catch_error([&] { c.all_reduce(buf, buf + 1, 4, dtype::f32, reduce_op::sum); }).kind == error_kind::usage);
  CHECK(catch_error([&] { c.all_gather(buf + 1, buf, 2, dtype::f32); }).kind == error_kind::usage);
  CHECK(catch_error([&] { c.reduce_scatter(buf, buf + 2, 2, dtype::f32, reduce_op::sum); }).kind == error_kind::usage);
  CHECK(!world.aborted());  // nothing reached the world
  CHECK(catch_error([] { (void)padded_count(4, 0); }).kind == error_kind::config);
}

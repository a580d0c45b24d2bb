// The thread communicator's waiting policy (comm/adaptive_spin.hpp): how the spin budget
// follows the waits a rank has seen, that a spin stops at once when it should give up, and
// where ranks are recorded as computing. The rule is deterministic given the waits, so these
// tests feed waits directly instead of timing threads.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "zshard/comm/adaptive_spin.hpp"
#include "zshard/comm/thread_comm.hpp"

using zshard::detail::adaptive_spin;
using zshard::detail::running_cpus;
using namespace std::chrono_literals;

TEST_CASE("the spin budget: raised to twice a short wait that slept, halved by a long one, kept in bounds") {
  adaptive_spin s;
  CHECK(s.budget_ns() == adaptive_spin::floor_ns);

  s.learn(30us, /*caught=*/false);  // slept, but the peer came within 30 us: spin 60 us next time
  CHECK(s.budget_ns() == 60'000);
  s.learn(10us, /*caught=*/false);  // a shorter wait never lowers it
  CHECK(s.budget_ns() == 60'000);
  s.learn(1us, /*caught=*/true);  // caught spinning: the budget was enough
  CHECK(s.budget_ns() == 60'000);
  s.learn(150us, /*caught=*/false);  // twice 150 us is past the ceiling
  CHECK(s.budget_ns() == adaptive_spin::ceiling_ns);

  s.learn(5ms, /*caught=*/false);  // a peer that far away is descheduled: spin less
  CHECK(s.budget_ns() == adaptive_spin::ceiling_ns / 2);
  for (int i = 0; i < 20; ++i) s.learn(1s, /*caught=*/false);
  CHECK(s.budget_ns() == adaptive_spin::floor_ns);  // never below the floor
}

TEST_CASE("a spin ends as soon as its wait is over, or at once when it must give up") {
  adaptive_spin s;
  s.learn(150us, false);  // the longest budget
  const auto start = adaptive_spin::clock::now();

  int checks = 0;
  CHECK(s.spin([&] { return ++checks == 3; }, [] { return false; }, start));
  CHECK(checks == 3);  // returned on the check that saw the wait end

  int give_up_calls = 0;
  CHECK_FALSE(s.spin([] { return false; }, [&] { return ++give_up_calls > 0; }, adaptive_spin::clock::now()));
  CHECK(give_up_calls == 1);  // the first look at give_up ended it, long before the budget

  // Without a reason to give up, a wait that never ends is left when the budget has passed.
  adaptive_spin short_budget;  // the floor: about a microsecond
  const auto t0 = adaptive_spin::clock::now();
  CHECK_FALSE(short_budget.spin([] { return false; }, [] { return false; }, t0));
  CHECK(adaptive_spin::clock::now() - t0 >= std::chrono::nanoseconds(adaptive_spin::floor_ns));
}

TEST_CASE("running_cpus: a rank waiting in a rendezvous is on no CPU; a computing peer is found on its CPU") {
  running_cpus cpus(3);
  const int here = zshard::detail::current_cpu();
  CHECK_FALSE(cpus.peer_computing_on(0, here));  // everyone starts waiting

  cpus.computing(1);  // rank 1 computes on this thread's CPU
  if (here >= 0) {
    CHECK(cpus.peer_computing_on(0, here));
    CHECK(cpus.peer_computing_on(2, here));
    CHECK_FALSE(cpus.peer_computing_on(1, here));  // a rank is not its own peer
  } else {
    MESSAGE("this platform does not report the current CPU: the same-core check is off");
  }
  CHECK_FALSE(cpus.peer_computing_on(0, -1));  // an unknown CPU never matches

  cpus.waiting(1);
  CHECK_FALSE(cpus.peer_computing_on(0, here));
}

TEST_CASE("ranks that wait on each other for long and short times still meet in step") {
  // Alternating long waits (which lower the budget) and back-to-back collectives (which raise
  // it) on 2 ranks: every all_reduce must still see both ranks' values.
  zshard::run_ranks(2, [](zshard::thread_comm& comm) {
    float mine = static_cast<float>(comm.rank() + 1), sum = 0;
    for (int i = 0; i < 200; ++i) {
      if (comm.rank() == i % 2 && i % 20 == 0) std::this_thread::sleep_for(2ms);
      comm.all_reduce(&mine, &sum, 1, zshard::dtype::f32, zshard::reduce_op::sum);
      REQUIRE(sum == 3.0f);
    }
  });
}

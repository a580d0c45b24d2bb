// The MPI communicator's errors, as thread_comm gives them: ranks that call different
// collectives all fail with a message naming each rank's call, bad arguments are usage errors
// on the calling rank, and a failed communicator refuses further use. (Whole-job failures, a
// rank that throws, returns early or hangs, are process-level: tests/mpi/failure_driver.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_support.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/checkpoint/agreement.hpp"
#include "zshard/comm/mpi_comm.hpp"

using namespace zshard;

namespace {

template <class F>
std::string comm_error(F&& f) {
  try {
    f();
  } catch (const error& e) {
    if (e.kind() != error_kind::comm) return "wrong kind: " + std::string(e.what());
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("ranks that disagree on a collective's arguments fail on every rank, naming each call") {
  mpi_comm probe(MPI_COMM_WORLD, mpi_test::options());
  if (probe.size() < 2) return;
  const int r = probe.rank();
  std::vector<float> a(16), b(16 * static_cast<std::size_t>(probe.size()));

  SUBCASE("different counts") {
    mpi_comm c(MPI_COMM_WORLD, mpi_test::options());
    const std::string msg = comm_error([&] { c.all_gather(a.data(), b.data(), r == 1 ? 3 : 2, dtype::f32); });
    CHECK(msg.find("collective mismatch: rank 0 called all_gather(count=2, f32) as collective #0") !=
          std::string::npos);
    CHECK(msg.find("rank 1 called all_gather(count=3, f32) as collective #0") != std::string::npos);
    CHECK(c.failed());
    const std::string again = comm_error([&] { c.barrier(); });
    CHECK(again.find("failed earlier") != std::string::npos);
  }
  // One rank's block goes in data messages (over inline_bytes), the others' inline: the headers
  // still meet first, and nothing is received at the wrong size.
  SUBCASE("counts on both sides of the inline edge") {
    const std::size_t n = r == 1 ? 2048 : 2;  // 8 KiB on rank 1: over inline_bytes (4 KiB)
    std::vector<float> src(2048 * static_cast<std::size_t>(probe.size())), dst(src.size());
    mpi_comm c(MPI_COMM_WORLD, mpi_test::options());
    std::string msg = comm_error([&] { c.all_gather(src.data(), dst.data(), n, dtype::f32); });
    CHECK(msg.find("collective mismatch: rank 0 called all_gather(count=2, f32)") != std::string::npos);
    CHECK(msg.find("rank 1 called all_gather(count=2048, f32) as collective #0") != std::string::npos);
    mpi_comm d(MPI_COMM_WORLD, mpi_test::options());
    msg = comm_error([&] { d.reduce_scatter(src.data(), dst.data(), n, dtype::f32, reduce_op::sum); });
    CHECK(msg.find("rank 1 called reduce_scatter(count=2048, f32, sum) as collective #0") != std::string::npos);
  }
  // Every rank's block is over inline_bytes and rank 1's is twice the others': its data messages
  // are longer than the receives the others would post for them, and Open MPI writes such a
  // message past the end of its receive. Nothing may be received before the headers matched:
  // the guard after each buffer stays as it was, and the caller's buffers too.
  SUBCASE("counts that differ above the inline size write nothing into either buffer") {
    const std::size_t most = 4096, n = r == 1 ? most : most / 2;  // 16 KiB on rank 1, 8 KiB elsewhere
    // each rank's buffers at its own count, then a guard where a longer message would spill
    const std::size_t all = n * static_cast<std::size_t>(probe.size()), guard = 2 * most;
    std::vector<float> src(all + guard, 1.0f), dst(all + guard, -1.0f);
    mpi_comm c(MPI_COMM_WORLD, mpi_test::options());
    std::string msg = comm_error([&] { c.all_gather(src.data(), dst.data(), n, dtype::f32); });
    CHECK(msg.find("collective mismatch: rank 0 called all_gather(count=2048, f32)") != std::string::npos);
    CHECK(msg.find("rank 1 called all_gather(count=4096, f32) as collective #0") != std::string::npos);
    probe.barrier();  // MPI progresses every request here: a receive left posted would complete now
    const auto untouched = [&](std::size_t from) {
      return std::count(dst.begin() + static_cast<std::ptrdiff_t>(from), dst.end(), -1.0f) ==
             static_cast<std::ptrdiff_t>(dst.size() - from);
    };
    CHECK(untouched(all));  // nothing past the buffer
    CHECK(untouched(0));    // nor in it
    mpi_comm d(MPI_COMM_WORLD, mpi_test::options());
    msg = comm_error([&] { d.reduce_scatter(src.data(), dst.data(), n, dtype::f32, reduce_op::sum); });
    CHECK(msg.find("rank 1 called reduce_scatter(count=4096, f32, sum) as collective #0") != std::string::npos);
    probe.barrier();
    CHECK(untouched(0));
  }
  SUBCASE("a skipped collective") {
    mpi_comm c(MPI_COMM_WORLD, mpi_test::options());
    const std::string msg = comm_error([&] {
      if (r != 1) c.barrier();
      c.all_reduce(a.data(), a.data(), 4, dtype::f32, reduce_op::sum);
    });
    CHECK(msg.find("collective mismatch") != std::string::npos);
    CHECK(msg.find("rank 1 called all_reduce(count=4, f32, sum) as collective #0") != std::string::npos);
    // the ranks that did not skip block in nothing: every rank saw the mismatch at its first call
  }
  SUBCASE("different op, dtype or root") {
    mpi_comm c1(MPI_COMM_WORLD, mpi_test::options()), c2(MPI_COMM_WORLD, mpi_test::options()),
        c3(MPI_COMM_WORLD, mpi_test::options());
    CHECK(comm_error([&] {
            c1.all_reduce(a.data(), a.data(), 4, dtype::f32, r == 1 ? reduce_op::max : reduce_op::sum);
          }).find("rank 1 called all_reduce(count=4, f32, max)") != std::string::npos);
    CHECK(comm_error([&] {
            c2.all_reduce(a.data(), a.data(), 4, r == 1 ? dtype::bf16 : dtype::f32, reduce_op::sum);
          }).find("rank 1 called all_reduce(count=4, bf16, sum)") != std::string::npos);
    CHECK(comm_error([&] {
            c3.broadcast(a.data(), 4, dtype::f32, r == 1 ? 1 : 0);
          }).find("rank 1 called broadcast(count=4, f32, root=1)") != std::string::npos);
  }
  probe.barrier();
}

// Options that shape messages must agree (a first message longer than its receive slot would
// be written past it): construction fails on every rank, naming the range.
TEST_CASE("ranks that pass different inline_bytes or check_arguments fail at construction, on every rank") {
  mpi_comm probe(MPI_COMM_WORLD, mpi_test::options());
  if (probe.size() < 2) return;
  const int r = probe.rank();
  mpi_options o = mpi_test::options();
  o.inline_bytes = r == 1 ? 65536 : 4096;
  std::string msg;
  try {
    mpi_comm c(MPI_COMM_WORLD, o);
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::usage);
    msg = e.what();
  }
  CHECK(msg.find("different mpi_options: inline_bytes from 4096 to 65536") != std::string::npos);
  o = mpi_test::options();
  o.check_arguments = r != 0;
  msg.clear();
  try {
    mpi_comm c(MPI_COMM_WORLD, o);
  } catch (const error& e) {
    msg = e.what();
  }
  CHECK(msg.find("check_arguments on some ranks, off on others") != std::string::npos);
  // The world is still usable afterwards: nothing was left in flight.
  mpi_comm after(MPI_COMM_WORLD, mpi_test::options());
  float x = float(r), sum = 0;
  after.all_reduce(&x, &sum, 1, dtype::f32, reduce_op::sum);
  CHECK(sum == float(probe.size() * (probe.size() - 1) / 2));
  probe.barrier();
}

// check_arguments off skips the separate argument round of all_reduce, broadcast and barrier;
// all_gather and reduce_scatter carry their header in their own messages and still compare it.
TEST_CASE("without check_arguments: the same results, and all_gather still names a count mismatch") {
  mpi_options o = mpi_test::options();
  o.check_arguments = false;
  mpi_comm c(MPI_COMM_WORLD, o);
  if (c.size() < 2) return;
  const int w = c.size(), r = c.rank();
  std::vector<float> mine(3, float(r + 1)), all(3 * static_cast<std::size_t>(w));
  c.all_gather(mine.data(), all.data(), 3, dtype::f32);
  for (int q = 0; q < w; ++q) CHECK(all[3 * static_cast<std::size_t>(q)] == float(q + 1));
  std::vector<float> grads(2 * static_cast<std::size_t>(w), float(r)), out(2);
  c.reduce_scatter(grads.data(), out.data(), 2, dtype::f32, reduce_op::sum);
  CHECK(out[0] == float(w * (w - 1) / 2));
  float x = float(r);
  c.all_reduce(&x, &x, 1, dtype::f32, reduce_op::max);
  CHECK(x == float(w - 1));
  c.barrier();
  const std::string msg = comm_error([&] { c.all_gather(mine.data(), all.data(), r == 1 ? 2 : 3, dtype::f32); });
  CHECK(msg.find("collective mismatch") != std::string::npos);
  CHECK(msg.find("rank 1 called all_gather(count=2, f32)") != std::string::npos);
}

// More ranks on a node than hardware threads: a waiting rank yields at once instead of spinning
// on the core a peer needs (mpi_options::spin). The launcher's count is what decides.
TEST_CASE("an oversubscribed node waits without spinning") {
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string keep = saved ? saved : "";
  const auto spin = std::chrono::microseconds(1000);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(cores + 1).c_str(), 1);
  CHECK(mpi_detail::spin_for_node(spin).count() == 0);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(cores).c_str(), 1);
  CHECK(mpi_detail::spin_for_node(spin) == spin);
  if (saved)
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", keep.c_str(), 1);
  else
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

TEST_CASE("bad arguments are usage errors on the calling rank, before any communication") {
  mpi_options huge = mpi_test::options();
  huge.inline_bytes = (std::size_t{1} << 20) + 1;  // over the 1 MiB bound: refused at construction
  try {
    mpi_comm refused(MPI_COMM_WORLD, huge);
    FAIL("inline_bytes over 1 MiB was accepted");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::usage);
    CHECK(std::string(e.what()).find("inline_bytes 1048577 exceeds 1048576") != std::string::npos);
  }
  mpi_comm c(MPI_COMM_WORLD, mpi_test::options());
  const int w = c.size();
  std::vector<float> a(64);
  auto usage = [](auto&& f) {
    try {
      f();
    } catch (const error& e) {
      return e.kind() == error_kind::usage;
    }
    return false;
  };
  CHECK(usage([&] { c.reduce_scatter(a.data(), a.data(), 1, dtype::f32, reduce_op::max); }));
  CHECK(usage([&] { c.broadcast(a.data(), 1, dtype::f32, w); }));
  CHECK(usage([&] { c.broadcast(a.data(), 1, dtype::f32, -1); }));
  CHECK(usage([&] { c.all_reduce(nullptr, a.data(), 1, dtype::f32, reduce_op::sum); }));
  CHECK(usage([&] { c.all_reduce(a.data(), a.data() + 1, 4, dtype::f32, reduce_op::sum); }));
  if (w > 1) CHECK(usage([&] { c.all_gather(a.data() + 1, a.data(), 2, dtype::f32); }));
  // A negative color is found after the (color, key) gather, on every rank alike: all ranks
  // throw the same usage error and the communicator stays consistent.
  CHECK(usage([&] { (void)c.split(c.rank() == 0 ? -2 : 0, 0); }));
  CHECK_FALSE(c.failed());
  c.barrier();  // none of the above left a collective half-done
}

namespace {
// What checkpoint::agree needs of an engine: a backend and the job's communicator.
struct bare_engine {
  host_backend& b;
  mpi_comm& c;
  host_backend& backend() { return b; }
  mpi_comm& comm() { return c; }
};
}  // namespace

TEST_CASE("an error of any length reaches every MPI rank whole, with its kind and hint (checkpoint::agree)") {
  mpi_comm c(MPI_COMM_WORLD, mpi_test::options());
  host_backend backend;
  bare_engine eng{backend, c};
  const int failing = c.size() - 1;
  for (const std::size_t length : {std::size_t{1}, std::size_t{1024}, std::size_t{5000}, std::size_t{70'000}}) {
    std::string message;
    for (std::size_t i = 0; i < length; ++i) message += i % 61 == 60 ? '\n' : char(i % 256);
    CAPTURE(length);
    try {
      checkpoint::agree(eng, "the test", [&] {
        if (c.rank() == failing) throw error(error_kind::config, message, "the hint");
      });
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.kind() == error_kind::config);
      CHECK(e.message() == "the test (rank " + std::to_string(failing) + "): " + message);
      CHECK(e.hint() == "the hint");
    }
  }
  CHECK_NOTHROW(checkpoint::agree(eng, "the test", [] {}));  // and nothing to say: one small exchange
}

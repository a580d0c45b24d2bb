// The MPI communicator against a serial reference and against the thread communicator, run
// as `mpiexec -n N` (N = 2 and 4 in ctest). Every process regenerates every rank's input
// (mpi_test::input), so each can compute the expected result of any collective by itself.
// Sizes do not divide by the world size; every dtype; in-place forms; count 0.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../support/split_rules.hpp"
#include "mpi_test_support.hpp"
#include "zshard/comm/mpi_comm.hpp"
#include "zshard/comm/thread_comm.hpp"

using namespace zshard;
using mpi_test::bytes;
using mpi_test::input;

namespace {

constexpr std::size_t sizes[] = {0, 1, 7, 1001, 4099 + 2048};  // the last spans several reduce chunks

std::string what(const char* op, std::size_t n, dtype t, int w) {
  return std::string(op) + ", n " + std::to_string(n) + ", " + std::string(to_string(t)) + ", world " +
         std::to_string(w);
}

}  // namespace

TEST_CASE("mpi collectives equal the serial rank-order reference for every dtype and size") {
  mpi_comm comm(MPI_COMM_WORLD, mpi_test::options());
  const int w = comm.size(), r = comm.rank();
  const auto uw = static_cast<std::size_t>(w), ur = static_cast<std::size_t>(r);
  std::uint32_t seed = 1;
  for (dtype t : mpi_test::all_dtypes) {
    const std::size_t es = size_of(t);
    for (std::size_t n : sizes) {
      ++seed;
      // all_gather of a parameter of n elements: shard_count(n, w) per rank, as the engine does
      const std::size_t block = shard_count(n, w);
      std::vector<bytes> shards;
      for (int q = 0; q < w; ++q) shards.push_back(input(t, block, seed, q));
      bytes full(block * uw * es), want;
      for (const auto& s : shards) want.insert(want.end(), s.begin(), s.end());
      comm.all_gather(shards[ur].data(), full.data(), block, t);
      CHECK_MESSAGE(full == want, what("all_gather", n, t, w));
      bytes in_place(block * uw * es);
      std::memcpy(in_place.data() + ur * block * es, shards[ur].data(), block * es);
      comm.all_gather(in_place.data() + ur * block * es, in_place.data(), block, t);
      CHECK_MESSAGE(in_place == want, what("all_gather in place", n, t, w));

      for (reduce_op op : {reduce_op::sum, reduce_op::average}) {
        std::vector<bytes> grads;
        for (int q = 0; q < w; ++q) grads.push_back(input(t, block * uw, seed + 1000, q));
        const bytes expect = mpi_test::reference_reduce(grads, ur * block, block, t, op);
        bytes got(block * es);
        comm.reduce_scatter(grads[ur].data(), got.data(), block, t, op);
        CHECK_MESSAGE(got == expect, what("reduce_scatter", n, t, w));
        bytes inplace = grads[ur];
        comm.reduce_scatter(inplace.data(), inplace.data() + ur * block * es, block, t, op);
        CHECK_MESSAGE(mpi_test::same_bytes(inplace.data() + ur * block * es, expect.data(), block * es),
                      what("reduce_scatter in place", n, t, w));
      }
      for (reduce_op op : {reduce_op::sum, reduce_op::average, reduce_op::max}) {
        std::vector<bytes> srcs;
        for (int q = 0; q < w; ++q) srcs.push_back(input(t, n, seed + 2000, q));
        const bytes expect = mpi_test::reference_reduce(srcs, 0, n, t, op);
        bytes got(n * es);
        comm.all_reduce(srcs[ur].data(), got.data(), n, t, op);
        CHECK_MESSAGE(got == expect, what("all_reduce", n, t, w));
        bytes inplace = srcs[ur];
        comm.all_reduce(inplace.data(), inplace.data(), n, t, op);
        CHECK_MESSAGE(inplace == expect, what("all_reduce in place", n, t, w));
      }
      for (int root = 0; root < w; ++root) {
        bytes b = input(t, n, seed + 3000, r);
        comm.broadcast(b.data(), n, t, root);
        CHECK_MESSAGE(b == input(t, n, seed + 3000, root), what("broadcast", n, t, w));
      }
    }
  }
  comm.barrier();
  CHECK(comm.collectives_called() > 0);
}

// A payload up to inline_bytes minus the 32-byte header rides in the collective's first message
// to each peer; one byte more goes in a data message of its own (mpi_exchange.hpp). Both sides
// of that edge, and inline_bytes 0 (every payload in data messages), give the reference's bits.
TEST_CASE("all_gather and reduce_scatter at the edge between inline payloads and data messages") {
  for (std::size_t limit : {std::size_t{0}, std::size_t{64}, std::size_t{4096}}) {
    mpi_options o = mpi_test::options();
    o.inline_bytes = limit;
    mpi_comm comm(MPI_COMM_WORLD, o);
    const int w = comm.size(), r = comm.rank();
    const auto uw = static_cast<std::size_t>(w), ur = static_cast<std::size_t>(r);
    const std::size_t edge = limit > 32 ? (limit - 32) / 4 : 1;  // f32 elements that just fit
    for (std::size_t block : {edge - 1, edge, edge + 1}) {
      if (block == 0) continue;
      INFO("inline_bytes ", limit, ", block ", block, " f32, world ", w);
      std::vector<bytes> shards, grads;
      for (int q = 0; q < w; ++q) {
        shards.push_back(input(dtype::f32, block, 7 + std::uint32_t(block), q));
        grads.push_back(input(dtype::f32, block * uw, 8 + std::uint32_t(block), q));
      }
      bytes want, full(block * uw * 4), got(block * 4);
      for (const auto& s : shards) want.insert(want.end(), s.begin(), s.end());
      comm.all_gather(shards[ur].data(), full.data(), block, dtype::f32);
      CHECK(full == want);
      comm.reduce_scatter(grads[ur].data(), got.data(), block, dtype::f32, reduce_op::sum);
      CHECK(got == mpi_test::reference_reduce(grads, ur * block, block, dtype::f32, reduce_op::sum));
    }
  }
}

TEST_CASE("mpi and thread communicators give the same bits at the same world size") {
  mpi_comm comm(MPI_COMM_WORLD, mpi_test::options());
  const int w = comm.size(), r = comm.rank();
  const auto uw = static_cast<std::size_t>(w);
  const std::size_t n = 3001;  // not divisible by 2, 3 or 4
  for (dtype t : mpi_test::all_dtypes) {
    const std::size_t es = size_of(t), block = shard_count(n, w);
    // MPI: this process's rank
    bytes mpi_ag(block * uw * es), mpi_rs(block * es), mpi_ar(n * es);
    const bytes shard = input(t, block, 11, r), grad = input(t, block * uw, 12, r), vals = input(t, n, 13, r);
    comm.all_gather(shard.data(), mpi_ag.data(), block, t);
    comm.reduce_scatter(grad.data(), mpi_rs.data(), block, t, reduce_op::average);
    comm.all_reduce(vals.data(), mpi_ar.data(), n, t, reduce_op::sum);
    // threads: the same world in this process; keep what thread rank r got
    bytes th_ag(block * uw * es), th_rs(block * es), th_ar(n * es);
    run_ranks(w, [&](thread_comm& tc) {
      const int q = tc.rank();
      const bytes s = input(t, block, 11, q), g = input(t, block * uw, 12, q), v = input(t, n, 13, q);
      bytes ag(block * uw * es), rs(block * es), ar(n * es);
      tc.all_gather(s.data(), ag.data(), block, t);
      tc.reduce_scatter(g.data(), rs.data(), block, t, reduce_op::average);
      tc.all_reduce(v.data(), ar.data(), n, t, reduce_op::sum);
      if (q == r) th_ag = ag, th_rs = rs, th_ar = ar;  // only thread q writes these
    });
    INFO(to_string(t), ", world ", w, ", rank ", r);
    CHECK(mpi_ag == th_ag);
    CHECK(mpi_rs == th_rs);
    CHECK(mpi_ar == th_ar);
  }
}

TEST_CASE("split: collectives inside sub-groups equal a serial reference over the group's members") {
  mpi_comm comm(MPI_COMM_WORLD, mpi_test::options());
  const int w = comm.size(), r = comm.rank();
  std::uint32_t seed = 500;
  for (const test_support::split_rule& rl : test_support::split_rules) {
    INFO(rl.name, ", world ", w);
    const auto members = test_support::split_members(rl, r, w);  // (key, parent rank), the group's order
    mpi_comm sub = comm.split(rl.color(r, w), rl.key(r, w));
    REQUIRE(sub.size() == static_cast<int>(members.size()));
    REQUIRE(members[static_cast<std::size_t>(sub.rank())].second == r);
    const auto gn = static_cast<std::size_t>(sub.size()), me = static_cast<std::size_t>(sub.rank());
    for (dtype t : mpi_test::all_dtypes) {
      ++seed;
      const std::size_t es = size_of(t), n = 1003, block = shard_count(n, sub.size());
      std::vector<bytes> vals, grads;  // in the group's rank order
      for (const auto& m : members) {
        vals.push_back(input(t, n, seed, m.second));
        grads.push_back(input(t, block * gn, seed + 1, m.second));
      }
      bytes ar(n * es), rs(block * es), ag(block * gn * es);
      sub.all_reduce(vals[me].data(), ar.data(), n, t, reduce_op::sum);
      CHECK(ar == mpi_test::reference_reduce(vals, 0, n, t, reduce_op::sum));
      sub.reduce_scatter(grads[me].data(), rs.data(), block, t, reduce_op::average);
      CHECK(rs == mpi_test::reference_reduce(grads, me * block, block, t, reduce_op::average));
      sub.all_gather(vals[me].data(), ag.data(), block, t);
      for (std::size_t g = 0; g < gn; ++g)
        CHECK(mpi_test::same_bytes(ag.data() + g * block * es, vals[g].data(), block * es));
    }
    // a split of a split: the group in halves again, by sub-rank parity
    mpi_comm inner = sub.split(sub.rank() % 2, 0);
    CHECK(inner.size() == (sub.size() + (sub.rank() % 2 == 0 ? 1 : 0)) / 2);
    float x = float(r + 1), sum = 0;
    inner.all_reduce(&x, &sum, 1, dtype::f32, reduce_op::sum);
    float want = 0;
    for (std::size_t g = me % 2; g < gn; g += 2) want += float(members[g].second + 1);
    CHECK(sum == want);
    comm.barrier();  // the parent stays usable beside its sub-groups
  }
}

// The thread communicator against serial references, for world sizes 1..8.
//
// Reference for reductions: the communicator's contract is "sum ranks in rank order 0..n-1 in
// f32, divide once for average, round once to the element type". So each result must equal,
// bit for bit on every rank, a serial loop that does exactly that (`reference_reduce`). A second,
// independent check compares against a float64 sum with a tolerance, so a wrong reference (or
// a wrong rank order that happens to match it) cannot pass unnoticed.
//
// count == 0 is valid: the collective synchronises and touches nothing; it is in every sweep.
// Inputs are normal(0, 1) from std::mt19937 seeded per (case, rank), stored in the element type.
// Rank threads only record what they got; every assertion runs on the test thread after join.
// Error propagation, timeouts, mismatches, abort and bad arguments: test_thread_comm_errors.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "zshard/comm/thread_comm.hpp"

using namespace zshard;
using bytes = std::vector<std::byte>;

namespace {

// Communicator concept: conforming and non-conforming types.
struct untagged_comm {
  int rank() const { return 0; }
  int size() const { return 1; }
  void all_gather(const void*, void*, std::size_t, dtype, comm_stream) {}
  void reduce_scatter(const void*, void*, std::size_t, dtype, reduce_op, comm_stream) {}
  void all_reduce(const void*, void*, std::size_t, dtype, reduce_op, comm_stream) {}
  void broadcast(void*, std::size_t, dtype, int, comm_stream) {}
  void barrier(comm_stream) {}
};
struct no_barrier_comm : untagged_comm {
  using zshard_tag = communicator_tag;
  void barrier(comm_stream) = delete;
};
// The stream is part of every collective: a communicator without it does not conform.
struct streamless_comm {
  using zshard_tag = communicator_tag;
  int rank() const { return 0; }
  int size() const { return 1; }
  void all_gather(const void*, void*, std::size_t, dtype) {}
  void reduce_scatter(const void*, void*, std::size_t, dtype, reduce_op) {}
  void all_reduce(const void*, void*, std::size_t, dtype, reduce_op) {}
  void broadcast(void*, std::size_t, dtype, int) {}
  void barrier() {}
};
struct tagged_comm : untagged_comm {
  using zshard_tag = communicator_tag;
};
static_assert(communicator<thread_comm>);
static_assert(communicator<tagged_comm>);
static_assert(!communicator<untagged_comm>);
static_assert(!communicator<no_barrier_comm>);
static_assert(!communicator<streamless_comm>);

static_assert(shard_count(10, 4) == 3 && padded_count(10, 4) == 12);
static_assert(shard_count(12, 4) == 3 && padded_count(12, 4) == 12);
static_assert(shard_count(0, 3) == 0 && padded_count(1, 8) == 8 && padded_count(7, 1) == 7);

constexpr dtype all_dtypes[] = {dtype::f32, dtype::bf16, dtype::f16};

bytes random_buffer(dtype t, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  bytes b(n * size_of(t));
  for (std::size_t i = 0; i < n; ++i) store_from_float(b.data(), t, i, normal(rng));
  return b;
}

// The contract, written serially: f32 in rank order, one division, one rounding.
bytes reference_reduce(const std::vector<const std::byte*>& srcs, std::size_t n, dtype t, reduce_op op) {
  bytes out(n * size_of(t));
  for (std::size_t i = 0; i < n; ++i) {
    float acc = load_as_float(srcs[0], t, i);
    for (std::size_t q = 1; q < srcs.size(); ++q) {
      const float x = load_as_float(srcs[q], t, i);
      acc = op == reduce_op::max ? std::max(acc, x) : acc + x;
    }
    if (op == reduce_op::average) acc /= static_cast<float>(srcs.size());
    store_from_float(out.data(), t, i, acc);
  }
  return out;
}

// Independent float64 check: |got - exact| within f32 summation error plus one rounding to t.
void check_near_double(const bytes& got, const std::vector<const std::byte*>& srcs, std::size_t n, dtype t,
                       reduce_op op) {
  const double unit = t == dtype::f32 ? 0x1p-24 : t == dtype::bf16 ? 0x1p-8 : 0x1p-11;
  for (std::size_t i = 0; i < n; ++i) {
    double sum = 0, abs_sum = 0, mx = -INFINITY;
    for (const std::byte* s : srcs) {
      const double x = load_as_float(s, t, i);
      sum += x, abs_sum += std::fabs(x), mx = std::max(mx, x);
    }
    const double w = static_cast<double>(srcs.size());
    const double exact = op == reduce_op::max ? mx : op == reduce_op::average ? sum / w : sum;
    const double scale = op == reduce_op::average ? 1 / w : 1;
    const double tol = w * 0x1p-23 * abs_sum * scale + std::fabs(exact) * unit + 0x1p-24;
    const double g = load_as_float(got.data(), t, i);
    if (std::fabs(g - exact) > tol) {
      FAIL_CHECK("element " << i << ": got " << g << ", float64 reference " << exact << ", tol " << tol);
      return;
    }
  }
}

std::string case_name(int world, std::size_t count, dtype t) {
  return "world " + std::to_string(world) + ", count " + std::to_string(count) + ", " + std::string(to_string(t));
}

}  // namespace

TEST_CASE("all_gather: every world size, dtype and count; out of place and in place") {
  const std::size_t counts[] = {0, 1, 7, 1000};
  for (int world = 1; world <= 8; ++world) {
    struct gather_case {
      std::size_t count;
      dtype t;
      bool in_place;
    };
    std::vector<gather_case> cases;
    for (std::size_t n : counts)
      for (dtype t : all_dtypes)
        for (bool ip : {false, true}) cases.push_back({n, t, ip});
    std::vector<std::vector<bytes>> in(cases.size()), out(cases.size());
    for (std::size_t k = 0; k < cases.size(); ++k)
      for (int r = 0; r < world; ++r) {
        in[k].push_back(random_buffer(cases[k].t, cases[k].count, std::uint32_t(1000 * k + r)));
        out[k].emplace_back(in[k][r].size() * std::size_t(world));
      }
    run_ranks(world, [&](thread_comm& c) {
      const auto r = std::size_t(c.rank());
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const std::size_t block = in[k][r].size();
        if (cases[k].in_place) {
          if (block) std::memcpy(out[k][r].data() + r * block, in[k][r].data(), block);
          c.all_gather(out[k][r].data() + r * block, out[k][r].data(), cases[k].count, cases[k].t);
        } else {
          c.all_gather(in[k][r].data(), out[k][r].data(), cases[k].count, cases[k].t);
        }
      }
    });
    for (std::size_t k = 0; k < cases.size(); ++k) {
      CAPTURE(case_name(world, cases[k].count, cases[k].t));
      CAPTURE(cases[k].in_place);
      bytes expect;
      for (int q = 0; q < world; ++q) expect.insert(expect.end(), in[k][q].begin(), in[k][q].end());
      for (int r = 0; r < world; ++r) CHECK(out[k][r] == expect);
    }
  }
}

namespace {

// Every count x dtype x operation, out of place and in place.
struct reduce_case {
  std::size_t count;
  dtype t;
  reduce_op op;
  bool in_place;
};
std::vector<reduce_case> reduce_cases(std::initializer_list<std::size_t> counts, std::initializer_list<reduce_op> ops) {
  std::vector<reduce_case> cases;
  for (std::size_t n : counts)
    for (dtype t : all_dtypes)
      for (reduce_op op : ops)
        for (bool in_place : {false, true}) cases.push_back({n, t, op, in_place});
  return cases;
}

}  // namespace

TEST_CASE("reduce_scatter: sum and average, every world size and dtype; in place") {
  // 3000 > one internal chunk
  const auto cases = reduce_cases({0, 1, 5, 257, 3000}, {reduce_op::sum, reduce_op::average});
  for (int world = 1; world <= 8; ++world) {
    std::vector<std::vector<bytes>> in(cases.size()), out(cases.size());
    for (std::size_t k = 0; k < cases.size(); ++k)
      for (int r = 0; r < world; ++r) {
        in[k].push_back(random_buffer(cases[k].t, cases[k].count * std::size_t(world), std::uint32_t(7000 * k + r)));
        out[k].emplace_back(in[k][r].size());  // in place: the whole input, result at block r
      }
    run_ranks(world, [&](thread_comm& c) {
      const auto r = std::size_t(c.rank());
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const auto& cs = cases[k];
        const std::size_t block = cs.count * size_of(cs.t);
        if (cs.in_place) {
          out[k][r] = in[k][r];
          c.reduce_scatter(out[k][r].data(), out[k][r].data() + r * block, cs.count, cs.t, cs.op);
          out[k][r].erase(out[k][r].begin(), out[k][r].begin() + std::ptrdiff_t(r * block));
        } else {
          c.reduce_scatter(in[k][r].data(), out[k][r].data(), cs.count, cs.t, cs.op);
        }
        out[k][r].resize(block);
      }
    });
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const auto& cs = cases[k];
      CAPTURE(case_name(world, cs.count, cs.t));
      CAPTURE(to_string(cs.op));
      CAPTURE(cs.in_place);
      for (int r = 0; r < world; ++r) {
        std::vector<const std::byte*> srcs;
        for (int q = 0; q < world; ++q) srcs.push_back(in[k][q].data() + std::size_t(r) * cs.count * size_of(cs.t));
        CHECK(out[k][r] == reference_reduce(srcs, cs.count, cs.t, cs.op));
        check_near_double(out[k][r], srcs, cs.count, cs.t, cs.op);
      }
    }
  }
}

TEST_CASE("all_reduce: sum, average and max, every world size and dtype; in place") {
  // 5000: slices span several chunks
  const auto cases = reduce_cases({0, 1, 3, 1001, 5000}, {reduce_op::sum, reduce_op::average, reduce_op::max});
  for (int world = 1; world <= 8; ++world) {
    std::vector<std::vector<bytes>> in(cases.size()), out(cases.size());
    for (std::size_t k = 0; k < cases.size(); ++k)
      for (int r = 0; r < world; ++r) {
        in[k].push_back(random_buffer(cases[k].t, cases[k].count, std::uint32_t(3000 * k + r)));
        out[k].emplace_back(in[k][r].size());
      }
    run_ranks(world, [&](thread_comm& c) {
      const auto r = std::size_t(c.rank());
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const auto& cs = cases[k];
        if (cs.in_place) {
          std::copy(in[k][r].begin(), in[k][r].end(), out[k][r].begin());
          c.all_reduce(out[k][r].data(), out[k][r].data(), cs.count, cs.t, cs.op);
        } else {
          c.all_reduce(in[k][r].data(), out[k][r].data(), cs.count, cs.t, cs.op);
        }
      }
    });
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const auto& cs = cases[k];
      CAPTURE(case_name(world, cs.count, cs.t));
      CAPTURE(to_string(cs.op));
      CAPTURE(cs.in_place);
      std::vector<const std::byte*> srcs;
      for (int q = 0; q < world; ++q) srcs.push_back(in[k][q].data());
      const bytes expect = reference_reduce(srcs, cs.count, cs.t, cs.op);
      for (int r = 0; r < world; ++r) CHECK(out[k][r] == expect);  // bitwise identical on every rank
      check_near_double(out[k][0], srcs, cs.count, cs.t, cs.op);
    }
  }
}

TEST_CASE("all_reduce max propagates NaN") {
  run_ranks(3, [](thread_comm& c) {
    float v[2] = {c.rank() == 1 ? NAN : 1.0f, float(c.rank())};
    c.all_reduce(v, v, 2, dtype::f32, reduce_op::max);
    if (!std::isnan(v[0]) || v[1] != 2.0f) throw std::runtime_error("max with NaN is wrong");
  });
}

TEST_CASE("broadcast: from every root, every world size") {
  for (int world = 1; world <= 8; ++world) {
    for (dtype t : {dtype::f32, dtype::bf16}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{3000}}) {
        std::vector<std::vector<bytes>> buf(static_cast<std::size_t>(world));  // [root][rank]
        for (int root = 0; root < world; ++root)
          for (int r = 0; r < world; ++r) buf[root].push_back(random_buffer(t, n, std::uint32_t(100 * root + r)));
        const auto original = buf;
        run_ranks(world, [&](thread_comm& c) {
          for (int root = 0; root < world; ++root) c.broadcast(buf[root][c.rank()].data(), n, t, root);
        });
        for (int root = 0; root < world; ++root)
          for (int r = 0; r < world; ++r) CHECK(buf[root][r] == original[root][root]);
      }
    }
  }
}

TEST_CASE("barrier: orders plain writes and reads across ranks, reusable") {
  for (int world : {1, 2, 5, 8}) {
    std::vector<int> value(std::size_t(world), -1);  // plain ints: TSan flags any unordered access
    std::vector<int> bad(std::size_t(world), 0);
    run_ranks(world, [&](thread_comm& c) {
      for (int round = 0; round < 50; ++round) {
        value[std::size_t(c.rank())] = round;
        c.barrier();
        for (int q = 0; q < world; ++q) bad[std::size_t(c.rank())] += value[std::size_t(q)] != round;
        c.barrier();
      }
    });
    for (int b : bad) CHECK(b == 0);
  }
}

TEST_CASE("a parameter not divisible by the world size, padded with padded_count") {
  // n = 10 over 4 ranks: padded to 12, 3 per rank; ZeRO's gradient path (reduce_scatter
  // average) then its parameter path (all_gather of the shards).
  const std::size_t n = 10;
  for (int world : {3, 4, 7}) {
    const std::size_t shard = shard_count(n, world), padded = padded_count(n, world);
    CHECK(padded == shard * std::size_t(world));
    CHECK(padded >= n);
    CHECK(padded - n < std::size_t(world));
    std::vector<std::vector<float>> grads(static_cast<std::size_t>(world)), full(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      grads[r].assign(padded, 0.0f);  // padding is zero
      for (std::size_t i = 0; i < n; ++i) grads[r][i] = float(r + 1) * float(i);
    }
    run_ranks(world, [&](thread_comm& c) {
      std::vector<float> my_shard(shard);
      c.reduce_scatter(grads[c.rank()].data(), my_shard.data(), shard, dtype::f32, reduce_op::average);
      full[c.rank()].resize(padded);
      c.all_gather(my_shard.data(), full[c.rank()].data(), shard, dtype::f32);
    });
    const float mean_scale = float(world + 1) / 2.0f;  // mean of 1..world
    for (int r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < n; ++i) CHECK(full[r][i] == doctest::Approx(mean_scale * float(i)));
      for (std::size_t i = n; i < padded; ++i) CHECK(full[r][i] == 0.0f);
    }
  }
}

TEST_CASE("many mixed collectives in a row keep the world in step") {
  std::vector<int> failures(4, 0);
  run_ranks(4, [&](thread_comm& c) {
    std::vector<float> a(13), g(13 * 4);
    for (int it = 0; it < 300; ++it) {
      std::fill(a.begin(), a.end(), float(c.rank() + it));
      c.all_reduce(a.data(), a.data(), a.size(), dtype::f32, reduce_op::sum);
      failures[c.rank()] += a[12] != float(6 + 4 * it);
      c.all_gather(a.data(), g.data(), a.size(), dtype::f32);
      failures[c.rank()] += g[51] != a[12];
      if (it % 7 == 0) c.barrier();
      c.broadcast(a.data(), 1, dtype::f32, it % 4);
    }
  });
  for (int f : failures) CHECK(f == 0);
}

// 01_thread_allreduce: N ranks as threads in one process, talking through zshard's thread
// communicator. Each rank builds a small vector, then runs the three collectives ZeRO-3 is
// made of, and checks what it got against what the math says it must be.
//
//   all_reduce      every rank ends with the element-wise sum over ranks
//   all_gather      every rank ends with every rank's block, in rank order (how parameters
//                   are gathered before a layer runs)
//   reduce_scatter  rank r ends with the average of block r over ranks (how gradients are
//                   reduced into the shard each rank owns)
//
// Usage: 01_thread_allreduce [ranks]    (default 4)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "zshard/comm/thread_comm.hpp"

namespace {

constexpr std::size_t block = 3;  // elements each rank contributes / owns

std::string format(const std::vector<float>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(static_cast<int>(v[i]));
  return s + "]";
}

struct rank_result {
  std::vector<float> summed, gathered, averaged;
};

}  // namespace

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 4;
  if (ranks < 1 || ranks > 256) {
    std::fprintf(stderr, "usage: %s [ranks 1..256]\n", argv[0]);
    return 2;
  }
  const std::size_t n = static_cast<std::size_t>(ranks);
  std::vector<rank_result> results(n);  // rank r writes only results[r]; read after the join

  try {
    zshard::run_ranks(ranks, [&](zshard::thread_comm& comm) {
      const int r = comm.rank();
      rank_result& out = results[static_cast<std::size_t>(r)];

      // all_reduce in place: element i of rank r holds 10 * r + i.
      out.summed.resize(block);
      for (std::size_t i = 0; i < block; ++i) out.summed[i] = static_cast<float>(10 * r) + static_cast<float>(i);
      comm.all_reduce(out.summed.data(), out.summed.data(), block, zshard::dtype::f32, zshard::reduce_op::sum);

      // all_gather: rank r contributes {r, r, r}.
      const std::vector<float> mine(block, static_cast<float>(r));
      out.gathered.resize(block * n);
      comm.all_gather(mine.data(), out.gathered.data(), block, zshard::dtype::f32);

      // reduce_scatter (average): every rank holds a full "gradient" where block b is 2 * b;
      // the average over ranks of block r is therefore 2 * r on every element.
      std::vector<float> gradient(block * n);
      for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = 2.0f * static_cast<float>(i / block);
      out.averaged.resize(block);
      comm.reduce_scatter(gradient.data(), out.averaged.data(), block, zshard::dtype::f32, zshard::reduce_op::average);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a rank failed: %s\n", e.what());
    return 1;
  }

  bool ok = true;
  for (int r = 0; r < ranks; ++r) {
    const rank_result& got = results[static_cast<std::size_t>(r)];
    std::printf("rank %d: all_reduce %s  all_gather %s  reduce_scatter %s\n", r, format(got.summed).c_str(),
                format(got.gathered).c_str(), format(got.averaged).c_str());
    for (std::size_t i = 0; i < block; ++i) {
      const float sum =
          10.0f * static_cast<float>(ranks * (ranks - 1) / 2) + static_cast<float>(ranks * static_cast<int>(i));
      ok = ok && got.summed[i] == sum && got.averaged[i] == 2.0f * static_cast<float>(r);
    }
    for (std::size_t i = 0; i < block * n; ++i) ok = ok && got.gathered[i] == static_cast<float>(i / block);
  }
  if (!ok) {
    std::printf("FAILED: some rank got a wrong result\n");
    return 1;
  }
  std::printf("ok: %d thread ranks agree on all_reduce, all_gather and reduce_scatter\n", ranks);
  return 0;
}

#pragma once
// Small-collective latency of the thread communicator (a section of comm_bandwidth): what one
// all_reduce of a bias-sized gradient, or a barrier, costs when ranks arrive together. Each
// figure is per collective, from K back-to-back calls timed on rank 0 between barriers; the
// median over several batches is reported (the machine is shared: medians, not minima).
// Key figure: thread_allreduce_small_us (1 KiB f32, 2 ranks).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "zshard/comm/thread_comm.hpp"

namespace thread_latency {

enum class small_op { all_reduce, barrier };

// Median microseconds per collective over `batches` batches of `per_batch` calls.
inline double small_collective_us(small_op op, int ranks, std::size_t bytes, int batches = 7, int per_batch = 2000) {
  std::vector<double> per_call;
  zshard::run_ranks(ranks, [&](zshard::thread_comm& c) {
    std::vector<float> buf(std::max<std::size_t>(1, bytes / sizeof(float)), 1.0f + float(c.rank()));
    for (int b = -1; b < batches; ++b) {
      c.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < per_batch; ++i) {
        if (op == small_op::all_reduce)
          c.all_reduce(buf.data(), buf.data(), buf.size(), zshard::dtype::f32, zshard::reduce_op::average);
        else
          c.barrier();
      }
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (c.rank() == 0 && b >= 0) per_call.push_back(t / per_batch * 1e6);
    }
  });
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

// Prints the table; returns thread_allreduce_small_us.
inline double print_small_collectives(bool quick) {
  std::printf("\nsmall collectives (latency): microseconds per call, median of batches of back-to-back calls\n");
  std::printf("%-12s %7s %5s %10s\n", "op", "bytes", "ranks", "us/call");
  double key = 0;
  for (int ranks : {2, 4}) {
    for (std::size_t bytes : {std::size_t{1024}, std::size_t{64} * 1024}) {
      const double us = small_collective_us(small_op::all_reduce, ranks, bytes, quick ? 3 : 7, quick ? 500 : 2000);
      if (ranks == 2 && bytes == 1024) key = us;
      std::printf("%-12s %7zu %5d %10.2f\n", "all_reduce", bytes, ranks, us);
    }
    std::printf("%-12s %7d %5d %10.2f\n", "barrier", 0, ranks,
                small_collective_us(small_op::barrier, ranks, 0, quick ? 3 : 7, quick ? 500 : 2000));
  }
  return key;
}

}  // namespace thread_latency

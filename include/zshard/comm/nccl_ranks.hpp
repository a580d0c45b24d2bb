#pragma once
// One process driving several GPUs: one thread and one NCCL rank per device (run_nccl_ranks),
// with the failure handling the NCCL communicator's own header describes (comm/nccl_comm.hpp).
// Runtime API and NCCL only: plain C++ translation units may include it.
#include <atomic>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "zshard/comm/nccl_comm.hpp"

namespace zshard {

// Runs fn(nccl_comm&) on one thread per device, rank i on devices[i] (single-process
// multi-GPU), and joins them. If a rank throws, the others stop waiting at once and the
// first failure is rethrown here, as run_ranks does for thread ranks: a failing communicator
// raises the shared flag when it aborts (report_failure), the failing thread aborts its own
// communicator as soon as it catches, and every peer polls the flag in each wait (theirs, and
// the backend's through poll_health), then aborts its own communicator.
template <class F>
void run_nccl_ranks(std::span<const int> devices, F&& fn, nccl_options opts = {}) {
  std::atomic<bool> failed{false};
  std::atomic<int> first{-1};
  opts.cancel = &failed;
  opts.report_failure = &failed;
  std::vector<nccl_comm> comms = nccl_comm::create_local(devices, opts);
  std::vector<std::exception_ptr> errors(devices.size());
  std::vector<std::thread> threads;
  threads.reserve(devices.size());
  for (std::size_t r = 0; r < devices.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        cuda::check(cudaSetDevice(devices[r]), "cudaSetDevice(" + std::to_string(devices[r]) + ")");
        fn(comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
        int none = -1;
        first.compare_exchange_strong(none, static_cast<int>(r));
        failed.store(true);
        comms[r].abort("rank " + std::to_string(r) + " of run_nccl_ranks failed");  // its own: this thread's
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed.load())
    for (auto& c : comms) c.abort("a rank of run_nccl_ranks failed");
  else
    nccl_comm::finalize_all(comms);
  // The root cause: the first rank to fail that was not merely stopped by a peer's failure.
  if (const int f = first.load(); f >= 0 && !comms[static_cast<std::size_t>(f)].stopped_by_peer())
    std::rethrow_exception(errors[static_cast<std::size_t>(f)]);
  for (std::size_t r = 0; r < devices.size(); ++r)
    if (errors[r] && !comms[r].stopped_by_peer()) std::rethrow_exception(errors[r]);
  if (const int f = first.load(); f >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(f)]);
}

}  // namespace zshard

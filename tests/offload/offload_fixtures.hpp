#pragma once
// What the offload tests share: a host backend that claims device memory, their training
// options and run, and the bitwise comparison of two trainings' parameters.
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <string>

#include "../engine/equivalence_check.hpp"
#include "../engine/hybrid_training.hpp"
#include "../engine/toy_training.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"

namespace offload_test {

// A host backend that claims its memory is device memory: the offloader then streams gradients
// and the working values of device-resident parameters through its staging halves, as on a GPU.
struct device_like_backend : zshard::host_backend {
  using zshard::host_backend::host_backend;
  static constexpr bool memory_is_host = false;
};

// World `world`, parameters of type t, two host threads for the Offloader, three steps of two
// micro-batches.
inline toy::train_options offload_options(int world, zshard::dtype t) {
  toy::train_options o = toy::base_options(world);
  o.engine.param_dtype = t;
  o.engine.offload.host_threads = 2;
  o.steps = 3;
  o.micro_batches = 2;
  return o;
}

// Checkpointed training with a no-grad pass per step (hybrid_training.hpp) on o.world thread
// ranks into `result`; then, on rank 0 alone and under the ranks' lock, record(eng, backend)
// reads what a test needs (ledgers, the Offloader's figures) while the engine is alive.
template <class Policies, class Backend, class Record>
void train_offloaded(const toy::train_options& o, toy::train_result& result, Record&& record) {
  std::mutex mu;
  zshard::run_ranks(o.world, [&](zshard::thread_comm& comm) {
    Backend backend;
    toy::ids id;
    zshard::engine<Backend, zshard::thread_comm, Policies> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
    toy::train_checkpointed_rank(eng, comm.rank(), o, mu, result);
    if (comm.rank() != 0) return;
    std::lock_guard lock(mu);
    record(eng, backend);
  });
}

// Every parameter of `got` equals `want`'s bit for bit, and both ran as many steps.
inline void check_same_params(const toy::train_result& got, const toy::train_result& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t p = 0; p < got.params.size(); ++p) {
    INFO("parameter #" << p);
    REQUIRE(got.params[p].size() == want.params[p].size());
    CHECK(std::memcmp(got.params[p].data(), want.params[p].data(), got.params[p].size() * sizeof(float)) == 0);
  }
  REQUIRE(got.reports.size() == want.reports.size());
}

}  // namespace offload_test

// The regression, reproduced by a compile-time policy swap: with the legacy tracker (counts
// recomputes, never resets) a checkpointed chain keeps every block gathered through backward;
// with the default tracker at most one block is gathered at a time.
#include "../support/policies.hpp"
#include "graph_harness.hpp"
#include "../support/legacy/legacy_tracker.hpp"

using namespace graph_test;

namespace {

constexpr int blocks = 12;
constexpr std::int64_t block_numel = 64;

model_spec chain() {
  model_spec spec;
  for (int b = 0; b < blocks; ++b) {
    const auto w = spec.add_param("w" + std::to_string(b), {block_numel});
    spec.add_module("block" + std::to_string(b), {w});
  }
  return spec;
}

template <class Tracker>
using chain_policies = test_support::with_hook_tracker<Tracker>;

// Checkpointed training of the chain; returns per-step peak gathered bytes.
template <class Tracker>
std::vector<std::size_t> run_chain(int world, std::size_t max_live, int steps) {
  using policies = chain_policies<Tracker>;
  const model_spec spec = chain();
  std::vector<std::size_t> peaks;
  std::mutex mu;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine_config cfg;
    cfg.prefetch.max_live_numel = max_live;
    cfg.prefetch.prefetch_numel = 0;  // isolate the tracker: nothing gathered ahead
    engine<host_backend, thread_comm, policies> eng(backend, comm, spec, cfg);
    std::vector<std::size_t> mine;
    for (int s = 0; s < steps; ++s) {
      backend.ledger().reset_peaks();
      for (module_id m = 0; m < blocks; ++m) auto scope = eng.forward(m);
      eng.begin_backward();
      for (module_id m = blocks; m-- > 0;) {
        { auto r = eng.recompute(m); }
        auto g = eng.backward(m);
        g.grad_data(0)[0] += 1.0f;
      }
      eng.end_backward();
      eng.step();
      mine.push_back(backend.ledger().peak(mem_category::gathered_params));
    }
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      peaks = mine;
    }
  });
  return peaks;
}

}  // namespace

TEST_CASE("default tracker: one block gathered at a time under checkpointing, flat across steps") {
  for (int world : {1, 3}) {
    const std::size_t padded = padded_count(block_numel, world);
    const auto peaks = run_chain<track::use_counter>(world, padded, 3);
    for (std::size_t p : peaks) CHECK(p == padded * sizeof(float));
  }
}

TEST_CASE("legacy tracker: every block stays gathered through backward") {
  const std::size_t padded = padded_count(block_numel, 2);
  // unlimited budget: the resident set grows to the whole chain
  const auto peaks = run_chain<legacy::tracker>(2, padded * blocks, 2);
  for (std::size_t p : peaks) CHECK(p == blocks * padded * sizeof(float));
  // a budget of two blocks: the leak breaks it, as a budget error naming max_live_numel
  CHECK_THROWS_WITH_AS(run_chain<legacy::tracker>(2, 2 * padded, 2), doctest::Contains("max_live_numel"),
                       error);
}

// The Reducer packs replicated gradients (biases, norm gains) into one all-reduce per flush:
// training is unchanged bit for bit against unpacked flushes and equals the float64 reference,
// the number of collectives drops as expected, and the planner charges the packed bucket
// exactly as the run's ledger does.
#include <doctest/doctest.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "equivalence_check.hpp"
#include "zshard/plan/llama_shape.hpp"
#include "zshard/plan/memory_plan.hpp"

using namespace zshard;

namespace {

struct packed_run {
  toy::train_result result;
  std::size_t collectives = 0;  // rank 0's reducer
};

packed_run train_counting(const toy::train_options& o) {
  packed_run out;
  out.result = toy::train_sharded(o, [&](auto& eng, auto&, int rank) {
    if (rank == 0) out.collectives = eng.reducer().collectives();
  });
  return out;
}

}  // namespace

TEST_CASE("packed replicated gradients: bit for bit the unpacked result, equal to the reference, fewer collectives") {
  for (int world : {1, 2, 3, 4}) {
    for (int micro : {1, 2}) {
      auto o = toy::base_options(world);
      o.micro_batches = micro;
      o.engine.reduce.reduce_bucket_numel = 1'000'000;  // one flush per backward: b0, b1, b2 packed
      const auto packed = train_counting(o);
      o.engine.reduce.reduce_bucket_numel = 1;  // every gradient flushed alone: nothing packed
      const auto single = train_counting(o);
      const std::string what = "world " + std::to_string(world) + ", " + std::to_string(micro) + " micro-batch(es)";
      INFO(what);
      REQUIRE(packed.result.params.size() == single.result.params.size());
      for (std::size_t p = 0; p < packed.result.params.size(); ++p) {
        const auto& a = packed.result.params[p];
        const auto& b = single.result.params[p];
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      }
      toy::check_equal(packed.result, toy::train_reference(o), dtype::f32, what);
      // per backward: E, c, W0..W2 reduce-scattered (sharded: more than 8 elements) and the three
      // trainable biases all-reduced, packed into one (s0 is frozen: no gradient)
      const std::size_t backwards = std::size_t(o.steps) * std::size_t(micro);
      CHECK(single.collectives == backwards * 8);
      CHECK(packed.collectives == backwards * 6);
    }
  }
}

TEST_CASE("packed replicated gradients: the plan charges the packs as the ledger does, for any pack size") {
  const auto model = plan::build_transformer({"tiny", 2, 64, 160, 4, 2, 96, false});
  const auto schedule = plan::transformer_schedule(model, {.micro_batch = 1, .seq_len = 8, .checkpoint = false});
  // 0: nothing packed; 130: packs of two 64-element gains or biases (and of one where the next does not fit);
  // 300: packs of a few; the default: one pack per flush
  for (std::size_t pack : {std::size_t{0}, std::size_t{130}, std::size_t{300}, reduce_config{}.replicated_pack_numel}) {
    engine_config cfg;
    cfg.partition.persistence_threshold_numel = 1000;  // gains, biases and small matrices replicated
    cfg.reduce.replicated_pack_numel = pack;
    const int world = 2;
    const plan::memory_plan plan = plan::plan_memory(model.spec, cfg, world, schedule);
    std::mutex mu;
    std::size_t measured = 0, collectives = 0, replicated = 0;
    std::vector<std::vector<float>> params;
    run_ranks(world, [&](thread_comm& comm) {
      host_backend backend;
      engine<host_backend, thread_comm> eng(backend, comm, model.spec, cfg);
      plan::run_step(eng, schedule);
      std::vector<std::vector<float>> mine;
      for (param_id p = 0; p < model.spec.params().size(); ++p) mine.push_back(eng.gather_param(p));
      std::lock_guard lock(mu);
      measured = backend.ledger().peak(mem_category::grad_buckets);
      collectives = eng.reducer().collectives();
      replicated = 0;
      for (param_id p = 0; p < model.spec.params().size(); ++p) replicated += eng.layout(p).replicated ? 1 : 0;
      params = std::move(mine);
    });
    INFO("replicated_pack_numel " << pack);
    REQUIRE(replicated >= 4);
    if (pack == 0) CHECK(collectives == model.spec.params().size());
    if (pack == reduce_config{}.replicated_pack_numel)
      CHECK(collectives == model.spec.params().size() - replicated + 1);  // one all-reduce for all replicated
    if (pack == 130 || pack == 300) {
      CHECK(collectives < model.spec.params().size());
      CHECK(collectives > model.spec.params().size() - replicated + 1);
    }
    CHECK(plan.device.peak[std::size_t(mem_category::grad_buckets)] == measured);
    static std::vector<std::vector<float>> first;  // every pack size trains the same parameters
    if (pack == 0) first = params;
    else CHECK(params == first);
  }
}

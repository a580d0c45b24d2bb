// Checkpoints of offloaded runs (issue 29): parameter shards in host memory and optimizer state
// on NVMe save, resume exactly and reshard, through the same state access as every other
// Offloader: a run resumed from its checkpoint equals the uninterrupted run bit for bit, and a
// checkpoint moves between offloaded and not offloaded engines of other world sizes unchanged.
#include <doctest/doctest.h>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;
using zshard::dtype;
using zshard::offload_tier;

namespace {

zshard::engine_config offloaded(dtype t, const std::string& nvme_dir) {
  auto c = engine_options(t);
  c.offload.params = offload_tier::host;
  c.offload.optimizer_state = offload_tier::nvme;
  c.offload.nvme_path = nvme_dir;
  c.offload.nvme_chunk_numel = 1024;
  c.offload.nvme_buffer_count = 3;
  return c;
}

}  // namespace

TEST_CASE("exact resume with parameters in host memory and optimizer state on NVMe") {
  temp_dir scratch;
  const toy::config mc{.dim = 24};  // several NVMe chunks per rank
  for (int world : {1, 3}) {
    for (dtype t : {dtype::f32, dtype::bf16}) {
      INFO("world " << world << ", " << zshard::to_string(t));
      temp_dir dir;
      const auto cfg = offloaded(t, scratch.path());
      const full_state straight = on_ranks<host_adam_policies>(
          world, cfg,
          [&](auto& eng, const toy::ids& id) {
            train_steps(eng, id, mc, 0, 3);
            ck::save(eng, dir.path());
            train_steps(eng, id, mc, 3, 2);
            return gather_all(eng);
          },
          mc);
      const full_state resumed = on_ranks<host_adam_policies>(
          world, cfg,
          [&](auto& eng, const toy::ids& id) {
            CHECK(ck::load(eng, dir.path()).step == 3);
            train_steps(eng, id, mc, 3, 2);
            return gather_all(eng);
          },
          mc);
      CHECK(straight.step == 5);
      CHECK(same_bits(straight, resumed));
      // the same training without offload: the same state, bit for bit
      const full_state in_memory = on_ranks<host_adam_policies>(
          world, engine_options(t),
          [&](auto& eng, const toy::ids& id) {
            train_steps(eng, id, mc, 0, 5);
            return gather_all(eng);
          },
          mc);
      CHECK(same_bits(straight, in_memory));
    }
  }
}

TEST_CASE("a checkpoint of an offloaded run reshards into engines with and without offload, and back") {
  temp_dir scratch, d1, d2;
  const toy::config mc{.dim = 24};
  const full_state saved = on_ranks<host_adam_policies>(
      3, offloaded(dtype::bf16, scratch.path()),
      [&](auto& eng, const toy::ids& id) {
        train_steps(eng, id, mc, 0, 2);
        ck::save(eng, d1.path());
        return gather_all(eng);
      },
      mc);
  CHECK(same_bits(saved, loaded_state(2, engine_options(dtype::bf16), d1.path(), mc)));
  const full_state back = on_ranks<host_adam_policies>(
      4, offloaded(dtype::bf16, scratch.path()),
      [&](auto& eng, const toy::ids&) {
        ck::load(eng, d1.path());
        ck::save(eng, d2.path());
        return gather_all(eng);
      },
      mc);
  CHECK(same_bits(saved, back));
  CHECK(same_bits(saved, loaded_state<host_adam_policies>(1, engine_options(dtype::bf16), d2.path(), mc)));
}

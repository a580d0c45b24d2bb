// Resharding: a checkpoint saved at world size A loads at world size B for every A, B in 1..8,
// with another shard alignment and persistence threshold at load (so parameters change from
// sharded to replicated and shard sizes do not divide): every field of every parameter comes
// back bit for bit, and training goes on as the float64 single-process reference does. A
// checkpoint written by one Offloader loads into the other.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;
using zshard::dtype;


TEST_CASE("resharding: saved at every world size A in 1..8, loaded at every B in 1..8, other layout") {
  const toy::config mc{};
  const auto save_cfg = engine_options(dtype::f32, 1, 0);  // everything sharded, no alignment
  const auto load_cfg = engine_options(dtype::f32, 4, 8);  // aligned shards, small parameters replicated
  const auto reference = reference_params(save_cfg);  // 4 uninterrupted steps in float64
  for (int a = 1; a <= 8; ++a) {
    temp_dir dir;
    const full_state saved = on_ranks(a, save_cfg, [&](auto& eng, const toy::ids& id) {
      train_steps(eng, id, mc, 0, 2, global_rows);
      ck::save(eng, dir.path());
      return gather_all(eng);
    });
    for (int b = 1; b <= 8; ++b) {
      INFO("saved at world " << a << ", loaded at world " << b);
      const loaded_then_trained r = load_and_train(b, load_cfg, dir.path(), a);
      CHECK(same_bits(r.loaded, saved));
      check_close(r.trained, reference);
    }
  }
}

TEST_CASE("a checkpoint of one Offloader loads into the other, bit for bit") {
  temp_dir d1, d2;
  const toy::config mc{};
  const auto cfg = engine_options(dtype::bf16);
  const full_state dev = on_ranks(3, cfg, [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, mc, 0, 2);
    ck::save(eng, d1.path());
    return gather_all(eng);
  });
  const full_state host = on_ranks<host_adam_policies>(2, cfg, [&](auto& eng, const toy::ids&) {
    ck::load(eng, d1.path());
    ck::save(eng, d2.path());
    return gather_all(eng);
  });
  CHECK(same_bits(dev, host));
  CHECK(same_bits(dev, loaded_state(5, cfg, d2.path())));
}

TEST_CASE("a sharded load's host peak is one chunk when pieces need staging, and no chunk when none does") {
  temp_dir dir;
  // one large parameter (1 Mi elements, 16 MiB of f32 state per rank file pair), saved in f32 at world 2
  zshard::model_spec spec;
  const auto w = spec.add_param("big", {1024, 1024});
  spec.add_module("m", {w});
  auto run = [&](int world, dtype t, auto&& fn) {
    zshard::run_ranks(world, [&](zshard::thread_comm& comm) {
      zshard::host_backend backend;
      zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, engine_options(t));
      fn(eng, backend);
    });
  };
  std::vector<float> saved;
  run(2, dtype::f32, [&](auto& eng, auto&) {
    ck::save(eng, dir.path());
    auto v = eng.gather_param(0);
    if (eng.comm().rank() == 0) saved = std::move(v);
  });
  constexpr std::size_t chunk = 64 << 10;
  // at world 3 in bf16: the working values are converted through the chunk, the rest read in place
  for (dtype t : {dtype::bf16, dtype::f32})
    run(3, t, [&](auto& eng, zshard::host_backend& backend) {
      INFO(zshard::to_string(t));
      backend.ledger().reset_peaks();
      const std::size_t before = backend.ledger().total_current();
      ck::load(eng, dir.path(), {.chunk_bytes = chunk});
      const std::size_t added = backend.ledger().total_peak() - before;
      if (t == dtype::bf16)
        CHECK(added == chunk);  // the chunk, nothing beside it (the agreements' blocks come after it is freed)
      else
        CHECK(added <= 8192);  // only the agreements' small blocks: every piece went straight into place
      CHECK(backend.ledger().total_current() == before);
      const auto full = eng.gather_param(0);  // and the values came through (rounded to bf16 there)
      REQUIRE(full.size() == saved.size());
      std::size_t same = 0;
      for (std::size_t i = 0; i < full.size(); ++i)
        same += full[i] == (t == dtype::bf16 ? zshard::to_float(zshard::to_bf16(saved[i])) : saved[i]);
      CHECK(same == full.size());
    });
}

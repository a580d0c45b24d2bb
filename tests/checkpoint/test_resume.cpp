// Exact resume: N steps, save, load into a fresh engine, M steps equals N + M uninterrupted
// steps bit for bit (every field of every parameter, the counters), with both Offloaders,
// f32 and bf16 working parameters, several world sizes. And the user's state comes back.
#include <doctest/doctest.h>

#include "ckpt_training.hpp"
#include "test_dir.hpp"

namespace ck = zshard::checkpoint;
using namespace ckpt_test;
using zshard::dtype;

namespace {

template <class Policies>
void exact_resume(int world, dtype t) {
  INFO("world " << world << ", " << zshard::to_string(t));
  temp_dir dir;
  const auto cfg = engine_options(t);
  const toy::config mc{};
  const full_state straight = on_ranks<Policies>(world, cfg, [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, mc, 0, 3);
    ck::save(eng, dir.path(), {.user_state = "data position 3"});
    train_steps(eng, id, mc, 3, 2);
    return gather_all(eng);
  });
  const full_state resumed = on_ranks<Policies>(world, cfg, [&](auto& eng, const toy::ids& id) {
    const auto loaded = ck::load(eng, dir.path());
    CHECK(loaded.step == 3);
    CHECK(loaded.user_state == "data position 3");
    CHECK(eng.steps_taken() == 3);
    train_steps(eng, id, mc, 3, 2);
    return gather_all(eng);
  });
  CHECK(straight.step == 5);
  CHECK(same_bits(straight, resumed));
  // and it trained at all: the state differs from a fresh engine's
  const full_state fresh = on_ranks<Policies>(world, cfg, [&](auto& eng, const toy::ids&) { return gather_all(eng); });
  CHECK(!same_bits(straight, fresh));
}

}  // namespace

TEST_CASE("exact resume, on_device Offloader: N steps + save + load + M steps == N + M steps, bit for bit") {
  for (int world : {1, 3, 4})
    for (dtype t : {dtype::f32, dtype::bf16}) exact_resume<zshard::default_policies>(world, t);
}

TEST_CASE("exact resume, host_adam Offloader (state written from host memory)") {
  for (int world : {1, 2, 5})
    for (dtype t : {dtype::f32, dtype::bf16}) exact_resume<host_adam_policies>(world, t);
}

TEST_CASE("exact resume keeps the loss-scaler state and a scheduled learning rate") {
  temp_dir dir;
  auto cfg = engine_options(dtype::f16);
  cfg.loss_scale = {.enabled = true, .initial_scale = 1024.f, .growth_factor = 2.f, .backoff_factor = 0.5f,
                    .growth_interval = 2, .min_scale = 1.f};
  const toy::config mc{};
  struct counters {
    float scale = 0, lr = 0;
    std::int64_t step = 0;
    full_state s;
  };
  const counters straight = on_ranks(3, cfg, [&](auto& eng, const toy::ids& id) {
    train_steps(eng, id, mc, 0, 3);
    eng.set_lr(4e-3f);
    ck::save(eng, dir.path());
    train_steps(eng, id, mc, 3, 2);
    return counters{eng.loss_scale(), eng.lr(), eng.steps_taken(), gather_all(eng)};
  });
  const counters resumed = on_ranks(3, cfg, [&](auto& eng, const toy::ids& id) {
    ck::load(eng, dir.path());
    CHECK(eng.lr() == 4e-3f);
    CHECK(eng.loss_scale() == 2048.f);  // grew once after 2 clean steps
    train_steps(eng, id, mc, 3, 2);
    return counters{eng.loss_scale(), eng.lr(), eng.steps_taken(), gather_all(eng)};
  });
  CHECK(straight.scale == resumed.scale);
  CHECK(resumed.scale == 4096.f);
  CHECK(straight.lr == resumed.lr);
  CHECK(same_bits(straight.s, resumed.s));
}

TEST_CASE("state access: gather_field and scatter_field round trip, and refuse misuse") {
  const auto cfg = engine_options();
  on_ranks(3, cfg, [&](auto& eng, const toy::ids& id) {
    std::vector<float> v(104);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.01f;
    zshard::scatter_field(eng, id.E, zshard::state_field::m, eng.comm().rank() == 1 ? v.data() : nullptr, 1);
    CHECK(zshard::gather_field(eng, id.E, zshard::state_field::m) == v);
    float x = 0;
    std::vector<float> big(1000);
    CHECK_THROWS_WITH_AS(eng.read_shard(id.s[0], zshard::state_field::master, 0, &x, 1), doctest::Contains("frozen"),
                         zshard::error);
    CHECK_THROWS_WITH_AS(eng.read_shard(id.E, zshard::state_field::m, 0, big.data(), 1000), doctest::Contains("shard has"),
                         zshard::error);
    {
      auto g = eng.forward(id.embed);
      CHECK_THROWS_WITH_AS(eng.read_shard(id.E, zshard::state_field::m, 0, &x, 1), doctest::Contains("during a step"),
                           zshard::error);
    }
    return 0;
  });
}

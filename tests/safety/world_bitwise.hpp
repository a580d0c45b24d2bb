#pragma once
// I11 (issue 26): training ends with bitwise the same parameters, master copies and moments for
// world sizes 1, 2, 3, 5 and hybrid 2 x 2, with both Offloaders, on the widest AdamW path this
// CPU has (what the host backend and host_adam pick by default). Every rank writes the same
// gradients, dyadic with short mantissas, so the averaged shards and the norm are exact and the
// same for every world size: what is left to differ is AdamW itself, whose elements fall in a
// full vector or in a kernel's tail depending on where the world size ends each shard. Four
// steps with clipping, f32 and bf16 working copies (bf16 takes the avx512_bf16 write-back).
//
// Included by safety/test_numerics.cpp (the tests' baseline build) and by native/test_native.cpp
// (built with -march=native, as the examples and benches are, where a scalar tail compiled with
// FMA rounds differently from the kernels' vector code).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/offload/host_adam.hpp"

namespace world_bitwise {

using namespace zshard;

struct host_adam_policies : default_policies {
  using offloader = offload::host_adam;
};

// Dyadic values with 7-bit mantissas over 2^-4..2^4 (sums of up to 8 equal ones and their
// average are exact in f32; squares and their sums exact in double).
inline float dyadic(std::size_t j) {
  const int m = 1 + int((j * 2654435761u) % 127);
  const int e = int((j * 40503u) % 9) - 4;
  return std::ldexp(float(m) * ((j % 3 == 0) ? -1.f : 1.f), e);
}

struct trained {
  std::vector<std::vector<float>> values;  // per parameter: working value, then master, m, v
};

template <class Policies>
trained train(int world, int shard_group, dtype working) {
  model_spec spec;
  const param_id w = spec.add_param("w", {10, 100}), b = spec.add_param("b", {37}, {.decay = false});
  spec.add_module("m", {w, b});
  engine_config cfg;
  cfg.param_dtype = working;
  cfg.clip_norm = 1.0;  // the coefficient multiplies every gradient: a full-mantissa scale
  cfg.adamw.weight_decay = 0.1f;
  cfg.hybrid.shard_group_size = shard_group;
  cfg.log = [](const std::string&) {};
  trained out;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, spec, cfg);
    for (int step = 0; step < 4; ++step) {
      eng.forward(0).close();
      eng.begin_backward();
      {
        auto g = eng.backward(0);
        std::size_t j = std::size_t(step) * 7919;
        for (std::size_t k = 0; k < 2; ++k)
          for (std::size_t i = 0; i < g.grad(k).numel(); ++i) g.grad_data(k)[i] = dyadic(j++);
      }
      eng.end_backward();
      eng.step();
    }
    trained mine;
    for (param_id p : {w, b}) {
      mine.values.push_back(eng.gather_param(p));
      for (state_field f : {state_field::master, state_field::m, state_field::v})
        mine.values.push_back(eng.gather_optimizer_state(p, f));
    }
    if (comm.rank() == 0) out = std::move(mine);
  });
  return out;
}

// Elements that differ in their bits from `want`.
inline std::size_t differing(const trained& got, const trained& want) {
  std::size_t bad = 0;
  REQUIRE(got.values.size() == want.values.size());
  for (std::size_t k = 0; k < got.values.size(); ++k) {
    REQUIRE(got.values[k].size() == want.values[k].size());
    for (std::size_t i = 0; i < got.values[k].size(); ++i)
      bad += std::memcmp(&got.values[k][i], &want.values[k][i], sizeof(float)) != 0;
  }
  return bad;
}

template <class Policies>
void check_world_sizes(const char* offloader) {
  for (dtype working : {dtype::f32, dtype::bf16}) {
    const trained want = train<Policies>(1, 0, working);
    for (auto [world, group] : {std::pair{2, 0}, std::pair{3, 0}, std::pair{5, 0}, std::pair{4, 2}}) {
      INFO(std::string(offloader) << ", " << to_string(working) << ", world " << world
                     << (group ? ", hybrid " + std::to_string(world / group) + " x " + std::to_string(group) : ""));
      CHECK(differing(train<Policies>(world, group, working), want) == 0);
    }
  }
}

inline const char* build_note() {
#if defined(__FMA__)
  return " (this program is built with FMA)";
#else
  return "";
#endif
}

}  // namespace world_bitwise

TEST_CASE("I11: world sizes 1, 2, 3, 5 and hybrid 2x2 train bitwise alike on the widest AdamW path") {
  MESSAGE("AdamW path: " << zshard::optim::to_string(zshard::optim::best_path()) << std::string(world_bitwise::build_note()));
  SUBCASE("on_device") { world_bitwise::check_world_sizes<zshard::default_policies>("on_device"); }
  SUBCASE("host_adam") { world_bitwise::check_world_sizes<world_bitwise::host_adam_policies>("host_adam"); }
}

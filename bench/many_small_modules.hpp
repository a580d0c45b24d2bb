#pragma once
// The model of the engine-overhead benches (seed_70b's scope overhead, engine_overhead): `modules`
// modules of two small parameters each (64 x 64 weight, 64 bias without decay), so a step is
// almost nothing but the engine's own bookkeeping. Only API that d43b7cf's headers also have:
// engine_overhead compiles it against those too.
#include <string>

#include "zshard/model/model_spec.hpp"

namespace zshard::bench {

inline model_spec many_small_modules(int modules) {
  model_spec spec;
  for (int i = 0; i < modules; ++i) {
    const std::string n = "m" + std::to_string(i);
    const param_id w = spec.add_param(n + ".w", {64, 64}), b = spec.add_param(n + ".b", {64}, {.decay = false});
    spec.add_module(n, {w, b});
  }
  return spec;
}

}  // namespace zshard::bench

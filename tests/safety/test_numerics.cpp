// Issue 11, point 9, against independent references: the global gradient norm and the clip
// coefficient do not depend on the world size (partial sums added in double, in rank order);
// a finite gradient whose sum of squares exceeds float's range is clipped, not skipped (as
// PyTorch's clip_grad_norm_ on CPU); a parameter that received no gradient in a step is left
// alone (torch.optim.AdamW skips a .grad of None), with its own bias-correction count.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "stack_model.hpp"
#include "world_bitwise.hpp"  // its test case: world sizes train bitwise alike
#include "zshard/offload/host_adam.hpp"

using namespace safety;

namespace {

model_spec two_params() {
  model_spec spec;
  const param_id w = spec.add_param("w", {10, 100}), b = spec.add_param("b", {37}, {.decay = false});
  spec.add_module("m", {w, b});
  return spec;
}

// Dyadic values with 7-bit mantissas over 2^-4..2^4: every rank writes the same gradient, so
// the averaged shards are exact and the true sum of squares is exact in double (~42 bits).
float dyadic(std::size_t j) {
  const int m = 1 + int((j * 2654435761u) % 127);
  const int e = int((j * 40503u) % 9) - 4;
  return std::ldexp(float(m) * ((j % 3 == 0) ? -1.f : 1.f), e);
}

struct one_step {
  step_report report;
  std::vector<float> w;
};

template <class Policies = default_policies>
one_step step_with(int world, float (*grad)(std::size_t), engine_config cfg = stack_config()) {
  const model_spec spec = two_params();
  one_step out;
  cfg.param_dtype = dtype::f32;
  run_ranks(world, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, spec, cfg);
    eng.forward(0).close();
    eng.begin_backward();
    {
      auto g = eng.backward(0);
      std::size_t j = 0;
      for (std::size_t k = 0; k < 2; ++k)
        for (std::size_t i = 0; i < g.grad(k).numel(); ++i) g.grad_data(k)[i] = grad(j++);
    }
    eng.end_backward();
    auto r = eng.step();
    auto w = eng.gather_param(0);
    if (comm.rank() == 0) out = {r, w};
  });
  return out;
}

}  // namespace

TEST_CASE("the clip coefficient and gradient norm are bitwise identical for world 1..8") {
  engine_config cfg = stack_config();
  cfg.clip_norm = 1.0;
  double exact = 0;
  for (std::size_t j = 0; j < 1037; ++j) exact += double(dyadic(j)) * double(dyadic(j));  // exact: ~42 bits
  const one_step base = step_with(1, dyadic, cfg);
  CHECK(base.report.grad_norm == std::sqrt(exact));
  CHECK(base.report.clip_coefficient < 1.0);
  for (int world = 2; world <= 8; ++world) {
    const one_step s = step_with(world, dyadic, cfg);
    CAPTURE(world);
    CHECK(std::bit_cast<std::uint64_t>(s.report.grad_norm) == std::bit_cast<std::uint64_t>(base.report.grad_norm));
    CHECK(std::bit_cast<std::uint64_t>(s.report.clip_coefficient) ==
          std::bit_cast<std::uint64_t>(base.report.clip_coefficient));
  }
}

TEST_CASE("a finite gradient whose sum of squares exceeds float's range is clipped, not skipped") {
  engine_config cfg = stack_config();
  cfg.clip_norm = 1.0;
  auto huge = [](std::size_t j) { return (j % 2 ? -3e19f : 2e19f); };  // finite; squares ~1e38..1e39 each
  for (int world : {1, 3}) {
    const one_step s = step_with(world, +huge, cfg);
    double sum = 0;
    for (std::size_t j = 0; j < 1037; ++j) sum += double(huge(j)) * double(huge(j));
    CAPTURE(world);
    CHECK(sum > double(std::numeric_limits<float>::max()));
    CHECK_FALSE(s.report.skipped);
    CHECK(s.report.grad_norm == doctest::Approx(std::sqrt(sum)).epsilon(1e-12));
    CHECK(s.report.clip_coefficient == doctest::Approx(1.0 / (std::sqrt(sum) + 1e-6)).epsilon(1e-12));
    for (float x : s.w) CHECK(std::isfinite(x));
  }
}

namespace {

struct host_adam_policies : default_policies {
  using offloader = offload::host_adam;
};

// Step 1 runs block 0 only (block 1 gets no gradient), step 2 both; returns block 1's weight
// after each step. `fresh`: block 1 takes part from step 1 instead, with step 2's gradients.
template <class Policies>
std::vector<std::vector<float>> unused_block(bool update_without_grad, bool fresh) {
  const model_spec spec = stack_spec(2, 0);
  engine_config cfg = stack_config();
  cfg.param_dtype = dtype::f32;
  cfg.adamw.weight_decay = 0.1f;
  cfg.adamw.update_params_without_grad = update_without_grad;
  std::vector<std::vector<float>> out;
  run_ranks(2, [&](thread_comm& comm) {
    host_backend backend;
    engine<host_backend, thread_comm, Policies> eng(backend, comm, spec, cfg);
    std::vector<std::vector<float>> mine;
    for (int step = 0; step < 2; ++step) {
      const std::vector<module_id> ms = (step == 0 && !fresh) ? std::vector<module_id>{0} : std::vector<module_id>{0, 1};
      for (module_id m : ms) eng.forward(m).close();
      eng.begin_backward();
      for (std::size_t i = ms.size(); i-- > 0;) {
        auto g = eng.backward(ms[i]);
        for (std::size_t k = 0; k < 2; ++k)
          for (std::size_t j = 0; j < g.grad(k).numel(); ++j) g.grad_data(k)[j] = 0.05f * float(j % 7) - 0.1f;
      }
      eng.end_backward();
      eng.step();
      mine.push_back(eng.gather_param(2));
      if (fresh) break;
    }
    if (comm.rank() == 0) out = mine;
  });
  return out;
}

template <class Policies>
void check_unused_block_skipped() {
  const auto def = unused_block<Policies>(false, false);
  const auto legacy = unused_block<Policies>(true, false);
  const auto fresh = unused_block<Policies>(false, true);
  std::vector<float> init;
  run_ranks(1, [&](thread_comm& comm) {
    host_backend backend;
    engine_config cfg = stack_config();
    cfg.param_dtype = dtype::f32;
    engine<host_backend, thread_comm> eng(backend, comm, stack_spec(2, 0), cfg);
    init = eng.gather_param(2);
  });
  CHECK(def[0] == init);     // no gradient in step 1: not decayed, not moved
  CHECK(legacy[0] != init);  // the option: decayed with a zero gradient
  CHECK(def[1] == fresh[0]);  // its first update uses its own step count (bias correction of step 1)
}

}  // namespace

TEST_CASE("a parameter that received no gradient is left alone by default (PyTorch), updated with the option") {
  SUBCASE("on_device") { check_unused_block_skipped<default_policies>(); }
  SUBCASE("host_adam") { check_unused_block_skipped<host_adam_policies>(); }
}

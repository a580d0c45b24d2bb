#pragma once
// The example GPT's Eigen model (the main job's zshard_gpt_runner) trained through zshard on
// the host backend, one rank, with gpt_equivalence_setup.hpp's setup: the host backend's run
// the backend-generic model is compared with, on the CPU and on the GPU.
#include "gpt_ops_equivalence.hpp"
#include "../../examples/gpt/zshard_gpt.hpp"

namespace gpt_equivalence {

// The Eigen model (f32 math; bf16 working parameters widened per scope when param_dtype is bf16).
inline run eigen_run(const setup& s) {
  return host_backend_run(s, [&](host_engine& eng, const gpt::zshard_model& model, auto&& train) {
    gpt::zshard_gpt_runner<host_engine> runner(eng, model, s.checkpoint);
    train([&](const gpt::batch& b) { return runner.train_micro_batch(b); });
  });
}

}  // namespace gpt_equivalence

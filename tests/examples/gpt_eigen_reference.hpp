#pragma once
// The example GPT's Eigen model (the main job's zshard_gpt_runner) trained through zshard on
// the host backend, one rank, with gpt_equivalence_setup.hpp's setup: the host backend's run
// the backend-generic model is compared with, on the CPU and on the GPU.
#include "gpt_ops_equivalence.hpp"
#include "../../examples/gpt/zshard_gpt.hpp"

namespace gpt_equivalence {

// The Eigen model (f32 math; bf16 working parameters widened per scope when param_dtype is bf16).
inline run eigen_run(const setup& s) {
  run out;
  const auto data = s.data();
  const auto model = gpt::make_zshard_model(s.model, s.seed);
  zshard::run_ranks(1, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    host_engine eng(backend, comm, model.spec, s.engine());
    gpt::zshard_gpt_runner<host_engine> runner(eng, model, s.checkpoint);
    for (int step = 0; step < s.steps; ++step) {
      out.losses.push_back(runner.train_micro_batch(s.batch_of(data, step)));
      out.grad_norms.push_back(eng.step().grad_norm);
    }
  });
  return out;
}

}  // namespace gpt_equivalence

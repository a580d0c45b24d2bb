#pragma once
// A training run of the backend-generic GPT (ops_runner.hpp) on host_ops through zshard on the
// host backend, one rank, reporting every step's loss and gradient norm. No Eigen: the GPU
// tests link it where Eigen may be missing. Its counterpart on the Eigen model (the main job's):
// gpt_eigen_reference.hpp. The CPU tests compare the two (tests/examples/test_gpt_ops.cpp) and
// the GPU tests compare the GPU run with both (tests/gpu/gpt_cases.hpp).
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpt_equivalence_setup.hpp"
#include "../../examples/gpt/host_ops.hpp"
#include "../../examples/gpt/ops_runner.hpp"
#include "../../examples/gpt/zshard_spec.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/comm/thread_comm.hpp"

namespace gpt_equivalence {

using host_engine = zshard::engine<zshard::host_backend, zshard::thread_comm>;

// s's model trained for s.steps steps through zshard on one rank of the host backend:
// with_model(eng, model, train) builds the model to train and calls train(loss_of), where
// loss_of(batch) runs one micro-batch and returns its loss; every step's loss and gradient norm.
template <class WithModel>
run host_backend_run(const setup& s, WithModel&& with_model) {
  run out;
  const auto data = s.data();
  const auto model = gpt::make_zshard_model(s.model, s.seed);
  zshard::run_ranks(1, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    host_engine eng(backend, comm, model.spec, s.engine());
    with_model(eng, model, [&](auto&& loss_of) {
      for (int step = 0; step < s.steps; ++step) {
        out.losses.push_back(loss_of(s.batch_of(data, step)));
        out.grad_norms.push_back(eng.step().grad_norm);
      }
    });
  });
  return out;
}

// The ops model on host_ops<H>: H = float with f32 parameters is the Eigen model's arithmetic;
// H = bf16 with bf16 parameters rounds where the GPU rounds.
template <class H>
run host_ops_run(const setup& s) {
  return host_backend_run(s, [&](host_engine& eng, const gpt::zshard_model& model, auto&& train) {
    gpt::host_ops<H> ops;
    gpt::ops_gpt<gpt::host_ops<H>> net(ops, s.model, s.batch, s.model.seq_len, s.checkpoint);
    gpt::ops_engine_runner<host_engine, gpt::host_ops<H>> runner(eng, model, &net, net.arena_bytes(), s.checkpoint);
    train([&](const gpt::batch& b) {
      runner.train_micro_batch(b);
      return runner.mean_loss();
    });
  });
}

}  // namespace gpt_equivalence

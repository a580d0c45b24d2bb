#pragma once
// The host runs the GPU GPT is compared with (tests/gpu/gpt_cases.hpp), compiled by the host
// compiler in their own translation unit (gpt_host_reference.cpp: Eigen stays out of nvcc).
#include "../examples/gpt_equivalence_setup.hpp"

namespace gpt_reference {

// The host backend's run of the example GPT (the Eigen model, f32 math, the setup's working
// dtype). False from has_eigen() when the build had no Eigen (bench/gpu/run.sh on a machine
// without it): then eigen_run() is not available.
bool has_eigen();
gpt_equivalence::run eigen_run(const gpt_equivalence::setup& s);
// The backend-generic model on host_ops<bf16>: rounds where the GPU rounds.
gpt_equivalence::run emulation_run(const gpt_equivalence::setup& s);

}  // namespace gpt_reference

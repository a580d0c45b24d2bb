// Host side of the GPU GPT checks (gpt_host_reference.hpp): plain C++, so Eigen is compiled by
// the host compiler only. Without Eigen (a GPU machine that lacks it) the emulation still builds.
#include "gpt_host_reference.hpp"

#include <stdexcept>

#include "../examples/gpt_ops_equivalence.hpp"
#if __has_include(<Eigen/Dense>)
#include "../examples/gpt_eigen_reference.hpp"
#define ZSHARD_GPT_REFERENCE_EIGEN 1
#endif

namespace gpt_reference {

gpt_equivalence::run emulation_run(const gpt_equivalence::setup& s) {
  return gpt_equivalence::host_ops_run<zshard::bf16>(s);
}

#ifdef ZSHARD_GPT_REFERENCE_EIGEN
bool has_eigen() { return true; }
gpt_equivalence::run eigen_run(const gpt_equivalence::setup& s) { return gpt_equivalence::eigen_run(s); }
#else
bool has_eigen() { return false; }
gpt_equivalence::run eigen_run(const gpt_equivalence::setup&) {
  throw std::logic_error("gpt_reference::eigen_run: this build has no Eigen");
}
#endif

}  // namespace gpt_reference

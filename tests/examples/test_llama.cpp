// zshard's Llama (examples/llama) against transformers' LlamaForCausalLM, on the fixture the
// generator wrote with transformers (tests/data/hf_llama, tools/hf_reference): the checkpoint is
// loaded through load_hf at world sizes 1, 2 and 3 (thread ranks), and the logits, the loss,
// the gradient of every parameter and every weight after 3 AdamW steps are compared with
// transformers' within the tolerances derived below.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "llama_fixture.hpp"

namespace {

using namespace llama_fixture;

// ---- the tolerances, and where they come from -----------------------------------------------
// Both sides compute in f32 (unit roundoff u = 2^-24 = 6.0e-8) from the same f32 values of the
// bf16/f16 weights in the files; they differ only in rounding: the order of the additions in
// every dot product and reduction (the host GEMM and attention add in double and round once;
// torch's f32 kernels add in blocks; the fused attention's softmax runs by tiles), and where
// exp, rsqrt, sin and cos round. Neither is the more exact, so a bound is twice what one side
// may err.
//
// Forward: per layer a chain of roundings through RMSNorm, the q/k/v products (K = 64 terms),
// RoPE, the scores (K = 16), softmax, P V (K = 12), o_proj (K = 64), the MLP's products (K = 64,
// 64, 128) and the residual adds; 2 layers, then the final norm and lm_head (K = 64). With
// independent rounding errors (the usual model: Higham, "Accuracy and Stability of Numerical
// Algorithms", 2nd ed., sec. 3.7) a K-term dot product errs by about sqrt(K) u relative to its
// terms' scale, and relative errors add along the chain: sqrt(2 (64 x 5 + 128 + 16 + 12) + 64) u
// ~ 32 u per side. The logits' terms are of the logits' own scale (|h| ~ 1 after the final
// norm), so
//   logits   |delta| <= 2 sides x 32 u x 8 (the worst of 18,432 values is ~4 sigma; 2x margin)
//            = 512 u = 3.1e-5, times max |logit| (3.0 here).
//   loss     a mean over 41 label positions of log(sum exp) - logit[target]: per position
//            about the logits' error sigma (2 x 32 u x 3.0 = 1.2e-5), averaged over 41 roughly
//            independent positions: sigma 1.8e-6; 5 sigma ~ 1e-5 absolute (loss ~ 5.8).
//   grads    the backward runs the forward's chain again, twice as deep: 2 sides x 64 u x 8
//            = 1024 u = 6.1e-5 of max |grad| of each tensor.
//   weights after 3 AdamW steps (lr 1e-2, eps 1e-8): an element moves by lr x m / (sqrt(v) +
//            eps) a step, |m / (sqrt(v) + eps)| <= 1. Where |g| >> eps the ratio hardly depends
//            on g's error (d/dg of g / (|g| + eps) is eps / (|g| + eps)^2); the weights then
//            differ by their own rounding (|w| u ~ 2e-8) and what the first steps' differences
//            feed back through the next gradients: for the elements whose first gradient is
//            >= 100 eps we require 1e-5 (3e-4 of the largest possible move, 3 lr).
//            Where |g| ~ eps the update amplifies a gradient difference by up to 1 / (4 eps)
//            = 2.5e7: such a gradient is a sum of terms ~100 times larger that cancel, and 1 %
//            of it (1e-10) moves the element by 2.5e-3 lr a step. No two f32 implementations
//            agree closer there; transformers' own f32 run ends 1.5e-5 from its float64 run
//            (reference.json). For every element we require 1e-4 = 3 lr / 300.
// Measured (x86-64 host, worlds 1, 2, 3; printed by each case): logits 7.4e-7 of max |logit|,
// loss 4.8e-7, gradients 1.3e-6 of max |grad|, weights 1.5e-6 (first gradient >= 100 eps) and
// 3.1e-5 (all: the largest at elements whose first gradient is ~1e-8).
constexpr double logits_tol = 3.1e-5;        // x max |logit|
constexpr double loss_tol = 1e-5;            // absolute
constexpr double grad_tol = 6.1e-5;          // x max |grad| of each tensor
constexpr double after_tol_steady = 1e-5;    // absolute, elements with |first gradient| >= 100 eps
constexpr double after_tol = 1e-4;           // absolute, every element
constexpr double steady_gradient = 100 * 1e-8;

struct measured {
  double logits = 0, loss = 0, grads = 0, after_steady = 0, after = 0;
};

measured check_run(const run_options& o) {
  const reference ref;
  const ck::hf_name_table names = ck::llama_hf_names();
  const std::string p = o.tied ? "tied." : "";
  const run_result r = run(o);
  measured m;
  const auto le = compare(r.logits, ref.floats(p + "logits"));
  m.logits = le.relative();
  CHECK(le.relative() <= logits_tol);
  m.loss = std::abs(r.step_losses.at(0) - double(ref.floats(p + "loss")[0]));
  CHECK(m.loss <= loss_tol);
  for (std::size_t q = 0; q < r.names.size(); ++q) {
    const std::string file = names.to_file(r.names[q]).value();
    const auto ge = compare(r.grads[q], ref.floats(p + "grad." + file));
    INFO("gradient of " << r.names[q] << " (" << file << ")");
    CHECK(ge.relative() <= grad_tol);
    m.grads = std::max(m.grads, ge.relative());
  }
  if (!o.tied) {
    const auto losses = ref.floats("step_losses");
    for (std::size_t s = 1; s < losses.size(); ++s) {
      INFO("loss before step " << s + 1);
      CHECK(std::abs(r.step_losses.at(s) - double(losses[s])) <= loss_tol);
      m.loss = std::max(m.loss, std::abs(r.step_losses.at(s) - double(losses[s])));
    }
    for (std::size_t q = 0; q < r.names.size(); ++q) {
      const std::string file = names.to_file(r.names[q]).value();
      const auto want = ref.floats("after." + file), first_grad = ref.floats("grad." + file);
      const auto ae = compare(r.after[q], want);
      double steady = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        if (std::abs(first_grad[i]) >= steady_gradient)
          steady = std::max(steady, std::abs(double(r.after[q][i]) - double(want[i])));
      INFO("weights of " << r.names[q] << " after 3 steps");
      CHECK(steady <= after_tol_steady);
      CHECK(ae.max_abs <= after_tol);
      m.after_steady = std::max(m.after_steady, steady);
      m.after = std::max(m.after, ae.max_abs);
    }
  }
  std::printf("llama vs transformers, world %d, micro %d, %s%s: logits %.2e (x max|logit|), loss %.2e, grads %.2e "
              "(x max|grad|)",
              o.world, o.micro, o.checkpoint ? "checkpointed" : "not checkpointed", o.tied ? ", tied" : "", m.logits,
              m.loss, m.grads);
  if (!o.tied) std::printf(", weights after 3 steps %.2e (first gradient >= 100 eps) %.2e (all)", m.after_steady, m.after);
  std::printf("\n");
  return m;
}

TEST_CASE("llama matches transformers: logits, loss, gradients and 3 AdamW steps at world sizes 1, 2, 3") {
  SUBCASE("world 1, no checkpointing") { check_run({.world = 1, .checkpoint = false}); }
  SUBCASE("world 2, checkpointing") { check_run({.world = 2}); }
  SUBCASE("world 3, checkpointing, 2 micro-batches a rank") { check_run({.world = 3, .micro = 2}); }
}

TEST_CASE("llama with tied embeddings matches transformers (one f16 file, no index)") {
  SUBCASE("world 1") { check_run({.tied = true, .world = 1, .steps = 1}); }
  SUBCASE("world 2") { check_run({.tied = true, .world = 2, .steps = 1}); }
}

TEST_CASE("llama3 RoPE scaling: the inverse frequencies transformers computes") {
  const reference ref;
  const auto want = ref.floats("llama3_rope.inv_freq");
  const auto cfg = ck::parse_hf_llama_config(R"({"model_type": "llama", "vocab_size": 16, "hidden_size": 2048,
      "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 16, "head_dim": 128,
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
                                             "llama3.json");
  const auto got = cfg.inv_freq();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("inv_freq[" << i << "]");
    CHECK(std::abs(double(got[i]) - double(want[i])) <= 4e-7 * std::abs(double(want[i])));  // a few f32 ulp
  }
  // the same, in transformers v4's spelling (rope_theta and rope_scaling at the top level)
  const auto v4 = ck::parse_hf_llama_config(R"({"model_type": "llama", "vocab_size": 16, "hidden_size": 2048,
      "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 16, "rope_theta": 500000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}})",
                                            "llama3_v4.json");
  CHECK(v4.inv_freq() == got);
}

}  // namespace

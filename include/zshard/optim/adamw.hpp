#pragma once
// AdamW with decoupled weight decay (Loshchilov & Hutter), following torch.optim.AdamW's
// single-tensor path. This is the scalar host reference that every other update (AVX2/AVX-512
// host kernels, CUDA kernels) is tested against, so it favours clarity over speed; the f32
// loop is still written so the compiler can vectorise it.
//
// Per element, with s = make_adamw_step(cfg, t, grad_scale, decay):
//   g  = grad * grad_scale              // unscale (loss scale, micro-batches) and clip in one
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p * (1 - lr * weight_decay)    // decay first, from the pre-update parameter
//   p  = p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
// with bc1 = 1 - beta1^t and bc2 = 1 - beta2^t. The last line is lr * m_hat / (sqrt(v_hat)
// + eps) arranged as PyTorch computes it, so results agree with PyTorch up to rounding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"

namespace zshard::optim {

struct adamw_config {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  // A trainable parameter that received no gradient in a step (no backward of a module using it
  // ran) is left alone, as torch.optim.AdamW does with a parameter whose .grad is None: not
  // decayed, not moved, and its own step count (bias correction) does not advance. Set this
  // to update it with a zero gradient instead (decay, and the moments keep moving it).
  bool update_params_without_grad = false;

  void validate() const {
    ZSHARD_REQUIRE(std::isfinite(lr) && lr > 0.0f, error_kind::config,
                   "adamw_config.lr = " + std::to_string(lr) + " must be finite and > 0",
                   "set lr to a positive learning rate such as 1e-4");
    ZSHARD_REQUIRE(beta1 >= 0.0f && beta1 < 1.0f, error_kind::config,
                   "adamw_config.beta1 = " + std::to_string(beta1) + " must lie in [0, 1)",
                   "use a momentum decay such as 0.9");
    ZSHARD_REQUIRE(beta2 >= 0.0f && beta2 < 1.0f, error_kind::config,
                   "adamw_config.beta2 = " + std::to_string(beta2) + " must lie in [0, 1)",
                   "use a second-moment decay such as 0.999 or 0.95");
    ZSHARD_REQUIRE(std::isfinite(eps) && eps > 0.0f, error_kind::config,
                   "adamw_config.eps = " + std::to_string(eps) + " must be finite and > 0",
                   "use a small positive value such as 1e-8; zero divides by zero for unused parameters");
    ZSHARD_REQUIRE(std::isfinite(weight_decay) && weight_decay >= 0.0f, error_kind::config,
                   "adamw_config.weight_decay = " + std::to_string(weight_decay) + " must be finite and >= 0",
                   "use 0 to turn decay off, or a value such as 0.01 or 0.1");
  }
};

// Everything one update needs for one optimizer step and one parameter group, resolved once
// per step on the host so kernels (host or device) take plain scalars.
struct adamw_step {
  float lr;
  float beta1, beta2, eps;
  float weight_decay;      // 0 for parameters that are not decayed
  float bias_correction1;  // 1 - beta1^t
  float bias_correction2;  // 1 - beta2^t
  float grad_scale;        // multiplies the raw gradient before use
};

// `step` is 1-based (the first update is step 1). `grad_scale` folds together
// 1 / (micro-batches * loss scale) and the clipping coefficient. `decay` is false for biases
// and norm gains, which conventionally get no weight decay.
inline adamw_step make_adamw_step(const adamw_config& cfg, std::int64_t step, float grad_scale, bool decay) {
  cfg.validate();
  ZSHARD_REQUIRE(step >= 1, error_kind::usage, "AdamW step " + std::to_string(step) + " is not 1-based",
                 "count optimizer steps from 1; step 0 would divide by a zero bias correction");
  ZSHARD_REQUIRE(std::isfinite(grad_scale) && grad_scale >= 0.0f, error_kind::usage,
                 "AdamW grad_scale = " + std::to_string(grad_scale) + " must be finite and >= 0",
                 "skip the step when gradients overflowed instead of passing a non-finite scale");
  // Bias corrections in double: 1 - beta^t loses digits in float when beta^t is close to 1.
  const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(step));
  return adamw_step{cfg.lr,
                    cfg.beta1,
                    cfg.beta2,
                    cfg.eps,
                    decay ? cfg.weight_decay : 0.0f,
                    static_cast<float>(bc1),
                    static_cast<float>(bc2),
                    grad_scale};
}

namespace detail {

// One instantiation per working dtype (W = void: no write-back) keeps the loop body free of
// branches on the dtype, which is what lets the compiler vectorise it. GCC and Clang only
// vectorise std::sqrt under -fno-math-errno (v >= 0 here, so errno is never set anyway);
// without it this stays a correct scalar loop. The f16 store branches and stays scalar.
template <class W>
inline void adamw_loop(const adamw_step& s, float* master, float* m, float* v, const float* grad, std::size_t n,
                       W* out) noexcept {
  const float b1 = s.beta1, one_minus_b1 = 1.0f - s.beta1;
  const float b2 = s.beta2, one_minus_b2 = 1.0f - s.beta2;
  const float eps = s.eps, gs = s.grad_scale;
  const float decay = 1.0f - s.lr * s.weight_decay;
  const float step_size = s.lr / s.bias_correction1;
  const float sqrt_bc2 = std::sqrt(s.bias_correction2);
  for (std::size_t i = 0; i < n; ++i) {
    const float g = grad[i] * gs;
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / sqrt_bc2 + eps;
    const float p = master[i] * decay - step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if constexpr (!std::is_void_v<W>) out[i] = from_float<W>(p);
  }
}

}  // namespace detail

// Updates n elements of the fp32 master copy and both moments in place from fp32 gradients.
// When working_out is non-null it also receives the updated master converted to working_type
// (round to nearest even) in the same pass, so the working copy needs no second sweep.
// master, m, v and grad must not overlap each other; working_out may alias master only when
// working_type is f32.
inline void adamw_update_scalar(const adamw_step& s, float* master, float* m, float* v, const float* grad,
                                std::size_t n, void* working_out, dtype working_type) noexcept {
  if (working_out == nullptr) return detail::adamw_loop<void>(s, master, m, v, grad, n, nullptr);
  switch (working_type) {
    case dtype::f32:
      return detail::adamw_loop(s, master, m, v, grad, n, static_cast<float*>(working_out));
    case dtype::bf16:
      return detail::adamw_loop(s, master, m, v, grad, n, static_cast<bf16*>(working_out));
    case dtype::f16:
      return detail::adamw_loop(s, master, m, v, grad, n, static_cast<f16*>(working_out));
  }
}

}  // namespace zshard::optim

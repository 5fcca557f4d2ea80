// Elementwise math shared by the cpu and cuda launchers: activations, Adam's update, and the
// small pieces of softmax and layer norm that are per element. Plain functions, no state.
#pragma once

#include <math.h>  // sqrtf, expf, logf in the global namespace for both g++ and nvcc

#include "kernels/bf16.hpp"
#include "kernels/exact_math.hpp"
#include "kernels/hd.hpp"

namespace spillway::kernels::ops {

// GELU, tanh approximation (as in GPT-2): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Evaluated as x s with s = 1 / (1 + exp(-2u)), since 0.5 (1 + tanh(u)) is the logistic of 2u:
// the same function, one expf in place of tanhf, which is about three times as fast on the host
// (the cpu backend's GELU had cost several times the GEMM in front of it).
inline constexpr float gelu_c = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float gelu_a = 0.044715f;

/// -2u for the u of x: the gate below is 1 / (1 + exp(gelu_exp_arg(x))). The cpu launchers
/// take the exponentials of a chunk at once (Note [Host exponentials]) and pass each one in.
SPILLWAY_HD inline float gelu_exp_arg(float x) {
  const float u = gelu_c * (x + gelu_a * x * x * x);
  return -2.0f * u;
}

/// 0.5 (1 + tanh(u)), the logistic of 2u, from e = exp(-2u).
SPILLWAY_HD inline float gelu_gate_of(float e) { return 1.0f / (1.0f + e); }

/// gelu(x) from e = exp(gelu_exp_arg(x)).
SPILLWAY_HD inline float gelu_of(float x, float e) { return x * gelu_gate_of(e); }

/// d gelu(x) / dx = s + x s (1 - s) 2 du/dx, with s the gate (0.5 (1 - tanh^2) = 2 s (1 - s)),
/// from e = exp(gelu_exp_arg(x)).
SPILLWAY_HD inline float gelu_grad_of(float x, float e) {
  const float s = gelu_gate_of(e);
  const float du = gelu_c * (1.0f + 3.0f * gelu_a * x * x);
  return s + x * (2.0f * s * (1.0f - s)) * du;
}

SPILLWAY_HD inline float gelu(float x) { return gelu_of(x, expf(gelu_exp_arg(x))); }

SPILLWAY_HD inline float gelu_grad(float x) { return gelu_grad_of(x, expf(gelu_exp_arg(x))); }

/// max(x, 0), and NaN for a NaN x (as PyTorch gives it), so a layer that diverged shows in what
/// follows instead of turning into zeros. x != x is the NaN test both compilers keep (the build
/// uses no fast-math).
SPILLWAY_HD inline float relu(float x) { return x > 0.0f || x != x ? x : 0.0f; }

/// ReLU's backward for one element: dy where x > 0, else exactly 0, whatever dy is (an inf or
/// NaN dy where x <= 0 or x is NaN gives 0, not the NaN that dy * 0 would). The derivative is
/// taken as 0 at x == 0.
SPILLWAY_HD inline float relu_backward(float x, float dy) { return x > 0.0f ? dy : 0.0f; }

/// Adam's coefficients for one step, bias corrections already worked out on the host.
struct adam_coeffs {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;  ///< decoupled (AdamW): p -= lr * weight_decay * p
  float bias_correction1;  ///< 1 - beta1^t
  float bias_correction2;  ///< 1 - beta2^t
};

/// One Adam step for one parameter: updates the moments m, v and the parameter p in place.
/// Bit-exact on every backend (Note [Exact math] in kernels/exact_math.hpp): each operation is
/// one correctly rounded step in this order, which kernels/cpu_adam_isa.cpp repeats in vectors.
SPILLWAY_HD inline void adam_update(float& p, float g, float& m, float& v, const adam_coeffs& c) {
  namespace x = exact;
  // m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g
  m = x::add(x::mul(c.beta1, m), x::mul(x::sub(1.0f, c.beta1), g));
  v = x::add(x::mul(c.beta2, v), x::mul(x::mul(x::sub(1.0f, c.beta2), g), g));
  const float m_hat = x::div(m, c.bias_correction1);
  const float v_hat = x::div(v, c.bias_correction2);
  // p = p - lr (m_hat / (sqrt(v_hat) + eps) + wd p)
  const float step = x::add(x::div(m_hat, x::add(x::sqrt(v_hat), c.eps)), x::mul(c.weight_decay, p));
  p = x::sub(p, x::mul(c.lr, step));
}

/// Adam in mixed precision: the fp32 step on the master p with the widened bf16 gradient, then
/// the bf16 weights w rounded from the new master.
SPILLWAY_HD inline void adam_update_mixed(float& p, bf16 g, float& m, float& v, bf16& w, const adam_coeffs& c) {
  adam_update(p, to_float(g), m, v, c);
  w = to_bf16(p);
}

/// Softmax backward for one element: dx = p * (dp - sum_j p_j dp_j).
SPILLWAY_HD inline float softmax_grad(float p, float dp, float dot) { return p * (dp - dot); }

/// Layer-norm backward for one element of a row (n columns), given the row's two sums
/// sum_j(dy_j gamma_j) and sum_j(dy_j gamma_j xhat_j).
SPILLWAY_HD inline float layer_norm_dx(float dy_gamma, float xhat, float rstd, float sum_dyg,
                                       float sum_dyg_xhat, float n) {
  return rstd * (dy_gamma - (sum_dyg + xhat * sum_dyg_xhat) / n);
}

}  // namespace spillway::kernels::ops

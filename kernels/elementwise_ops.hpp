// The elementwise kernels as index functors over the SPILLWAY_HD math of kernels/ops.hpp: the
// cpu launcher (elementwise.cpp) and the CUDA map kernel (elementwise.cu) run these same bodies.
#pragma once

#include <cstddef>

#include "kernels/hd.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::ops {

/// An activation: its value f(x) and its derivative f'(x).
struct gelu_act {
  SPILLWAY_HD static float f(float x) { return gelu(x); }
  SPILLWAY_HD static float df(float x) { return gelu_grad(x); }
};
struct relu_act {
  SPILLWAY_HD static float f(float x) { return relu(x); }
  SPILLWAY_HD static float df(float x) { return relu_grad(x); }
};

/// y = A::f(x), element i.
template <class A>
struct activation_f {
  const float* x;
  float* y;
  SPILLWAY_HD void operator()(std::size_t i) const { y[i] = A::f(x[i]); }
};

/// dx = dy * A::f'(x), element i.
template <class A>
struct activation_grad_f {
  const float* x;
  const float* dy;
  float* dx;
  SPILLWAY_HD void operator()(std::size_t i) const { dx[i] = dy[i] * A::df(x[i]); }
};

/// y = a + b, element i.
struct add_f {
  const float* a;
  const float* b;
  float* y;
  SPILLWAY_HD void operator()(std::size_t i) const { y[i] = a[i] + b[i]; }
};

/// y = alpha * x, element i.
struct scale_f {
  const float* x;
  float alpha;
  float* y;
  SPILLWAY_HD void operator()(std::size_t i) const { y[i] = alpha * x[i]; }
};

}  // namespace spillway::kernels::ops

/// Calls X(functor type) for each functor above: the CUDA map launcher is instantiated for these.
#define SPILLWAY_ELEMENTWISE_FUNCTORS(X)                                                    \
  X(::spillway::kernels::ops::activation_f<::spillway::kernels::ops::gelu_act>)            \
  X(::spillway::kernels::ops::activation_grad_f<::spillway::kernels::ops::gelu_act>)       \
  X(::spillway::kernels::ops::activation_f<::spillway::kernels::ops::relu_act>)            \
  X(::spillway::kernels::ops::activation_grad_f<::spillway::kernels::ops::relu_act>)       \
  X(::spillway::kernels::ops::add_f)                                                        \
  X(::spillway::kernels::ops::scale_f)

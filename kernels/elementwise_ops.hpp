// The elementwise kernels as index functors over the SPILLWAY_HD math of kernels/ops.hpp: the
// cpu launcher (elementwise.cpp) and the CUDA map kernel (elementwise.cu) run these same bodies.
// Each is templated on the storage type T (float or bf16): it loads in float32, computes in
// float32 and rounds once when it stores (kernels/bf16.hpp), so one body serves both precisions.
#pragma once

#include <cstddef>

#include "kernels/bf16.hpp"
#include "kernels/hd.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::ops {

/// An activation: its value f(x) and the gradient dx its backward gives for one element.
struct gelu_act {
  SPILLWAY_HD static float f(float x) { return gelu(x); }
  SPILLWAY_HD static float dx(float x, float dy) { return dy * gelu_grad(x); }
};
struct relu_act {
  SPILLWAY_HD static float f(float x) { return relu(x); }
  SPILLWAY_HD static float dx(float x, float dy) { return relu_backward(x, dy); }
};

/// y = A::f(x), element i.
template <class A, class T>
struct activation_f {
  const T* x;
  T* y;
  SPILLWAY_HD void operator()(std::size_t i) const { y[i] = store_as<T>(A::f(load(x[i]))); }
};

/// dx = A::dx(x, dy) (dy * f'(x) for GELU; dy where x > 0, else 0, for ReLU), element i.
template <class A, class T>
struct activation_grad_f {
  const T* x;
  const T* dy;
  T* dx;
  SPILLWAY_HD void operator()(std::size_t i) const { dx[i] = store_as<T>(A::dx(load(x[i]), load(dy[i]))); }
};

// One name per functor and storage type (the list below passes each as one macro argument).
template <class T>
using gelu_f = activation_f<gelu_act, T>;
template <class T>
using gelu_grad_f = activation_grad_f<gelu_act, T>;
template <class T>
using relu_f = activation_f<relu_act, T>;
template <class T>
using relu_grad_f = activation_grad_f<relu_act, T>;

/// y = a + b, element i.
template <class T>
struct add_f {
  const T* a;
  const T* b;
  T* y;
  SPILLWAY_HD void operator()(std::size_t i) const { y[i] = store_as<T>(load(a[i]) + load(b[i])); }
};

/// y = alpha * x, element i.
template <class T>
struct scale_f {
  const T* x;
  float alpha;
  T* y;
  SPILLWAY_HD void operator()(std::size_t i) const { y[i] = store_as<T>(alpha * load(x[i])); }
};

/// y[r, c] += bias[c] for a row-major matrix with `cols` columns, element i = r * cols + c.
template <class T>
struct bias_add_f {
  T* y;
  const T* bias;
  std::size_t cols;
  SPILLWAY_HD void operator()(std::size_t i) const { add_bias(i, i % cols); }
  /// The same for element i whose column the caller already knows.
  SPILLWAY_HD void add_bias(std::size_t i, std::size_t c) const { y[i] = store_as<T>(load(y[i]) + load(bias[c])); }
};

/// y = x converted between storage types, element i: float32 -> bf16 rounds to nearest even,
/// bf16 -> float32 is exact (kernels/bf16.hpp).
template <class From, class To>
struct convert_f {
  const From* x;
  To* y;
  SPILLWAY_HD void operator()(std::size_t i) const { y[i] = store_as<To>(load(x[i])); }
};
using narrow_f = convert_f<float, bf16>;
using widen_f = convert_f<bf16, float>;

}  // namespace spillway::kernels::ops

/// Calls X(functor type) for each functor above run by the map kernel, in both storage types:
/// the CUDA map launcher is instantiated for these.
#define SPILLWAY_ELEMENTWISE_FUNCTORS_OF(X, T)         \
  X(::spillway::kernels::ops::gelu_f<T>)               \
  X(::spillway::kernels::ops::gelu_grad_f<T>)          \
  X(::spillway::kernels::ops::relu_f<T>)               \
  X(::spillway::kernels::ops::relu_grad_f<T>)          \
  X(::spillway::kernels::ops::add_f<T>)                \
  X(::spillway::kernels::ops::scale_f<T>)              \
  X(::spillway::kernels::ops::bias_add_f<T>)
#define SPILLWAY_ELEMENTWISE_FUNCTORS(X)                 \
  SPILLWAY_ELEMENTWISE_FUNCTORS_OF(X, float)             \
  SPILLWAY_ELEMENTWISE_FUNCTORS_OF(X, ::spillway::kernels::bf16) \
  X(::spillway::kernels::ops::narrow_f)                  \
  X(::spillway::kernels::ops::widen_f)

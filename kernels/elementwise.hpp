// Elementwise kernels and the bias pair: bias add (+ its backward, column sums), GELU, ReLU,
// residual add and scale. Row-major [rows, cols]; n counts elements.
#pragma once

#include <cstddef>

#include "kernels/context.hpp"

namespace spillway::kernels {

/// y[r, c] += bias[c] for a row-major [rows, cols] matrix, in place.
void bias_add(kernel_context& ctx, stream s, float* y, const float* bias, int rows, int cols);

/// dbias[c] (+)= sum over r of dy[r, c]. Summed row by row in order, so deterministic.
void bias_backward(kernel_context& ctx, stream s, const float* dy, float* dbias, int rows, int cols,
                   bool accumulate);

/// y = gelu(x) (tanh approximation, as GPT-2). y may alias x.
void gelu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n);
/// dx = dy * gelu'(x). dx may alias dy.
void gelu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n);

/// y = max(x, 0). y may alias x.
void relu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n);
/// dx = dy where x > 0, else 0. dx may alias dy.
void relu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n);

/// y = a + b (residual connection; also accumulates a gradient: add(g, d, g)). y may alias a or b.
void add(kernel_context& ctx, stream s, const float* a, const float* b, float* y, std::size_t n);

/// y = alpha * x. y may alias x.
void scale(kernel_context& ctx, stream s, const float* x, float alpha, float* y, std::size_t n);

}  // namespace spillway::kernels

// Elementwise kernels and the bias pair: bias add (+ its backward, column sums), GELU, ReLU,
// residual add and scale. Row-major [rows, cols]; n counts elements. Each kernel has a float32
// form and a bf16 form (same name, bf16 tensors, float scalars): the bf16 form widens its
// inputs, computes in float32 as the float32 form does, and rounds each output once
// (kernels/bf16.hpp), so its result is to_bf16 of the float32 form's on the widened inputs.
#pragma once

#include <cstddef>

#include "kernels/bf16.hpp"
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

/// y = max(x, 0); a NaN x gives NaN (as in PyTorch), so a diverged layer is not hidden as zeros.
/// y may alias x.
void relu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n);
/// dx = dy where x > 0, else 0 (exactly 0, even for an inf or NaN dy, and where x is NaN).
/// dx may alias dy.
void relu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n);

/// y = a + b (residual connection; also accumulates a gradient: add(g, d, g)). y may alias a or b.
void add(kernel_context& ctx, stream s, const float* a, const float* b, float* y, std::size_t n);

/// y = alpha * x. y may alias x.
void scale(kernel_context& ctx, stream s, const float* x, float alpha, float* y, std::size_t n);

/// y = x rounded to bf16 (to nearest, ties to even, denormals kept: Note [bf16 rounding]), and
/// y = x widened to float32 (exact). The same bits on every backend.
void convert(kernel_context& ctx, stream s, const float* x, bf16* y, std::size_t n);
void convert(kernel_context& ctx, stream s, const bf16* x, float* y, std::size_t n);

// bf16 forms of the kernels above; bias_backward sums each column in float32 (starting from the
// widened dbias with accumulate) and rounds the sum once.
void bias_add(kernel_context& ctx, stream s, bf16* y, const bf16* bias, int rows, int cols);
void bias_backward(kernel_context& ctx, stream s, const bf16* dy, bf16* dbias, int rows, int cols,
                   bool accumulate);
void gelu_forward(kernel_context& ctx, stream s, const bf16* x, bf16* y, std::size_t n);
void gelu_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* dy, bf16* dx, std::size_t n);
void relu_forward(kernel_context& ctx, stream s, const bf16* x, bf16* y, std::size_t n);
void relu_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* dy, bf16* dx, std::size_t n);
void add(kernel_context& ctx, stream s, const bf16* a, const bf16* b, bf16* y, std::size_t n);
void scale(kernel_context& ctx, stream s, const bf16* x, float alpha, bf16* y, std::size_t n);

}  // namespace spillway::kernels

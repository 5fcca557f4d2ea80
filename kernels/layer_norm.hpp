// Layer normalisation over the last dimension of a row-major [rows, cols] matrix, with a
// learned scale (gamma) and shift (beta), forward and backward; float32 and bf16 storage.
#pragma once

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace spillway::kernels {

/// y = (x - mean) * rstd * gamma + beta per row; saves mean[rows] and rstd[rows] for backward
/// (rstd = 1 / sqrt(var + eps), biased variance).
void layer_norm_forward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd, int rows, int cols,
                        float eps = 1e-5f);

/// dx[rows, cols] = d loss / dx (overwritten; dx may not alias dy); dgamma[cols] and dbeta[cols]
/// are overwritten or, with accumulate, added to. Column sums run over rows in order.
void layer_norm_backward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                         const float* mean, const float* rstd, const float* dy, float* dx,
                         float* dgamma, float* dbeta, int rows, int cols, bool accumulate);

/// bf16 storage for x, gamma, beta, y, dy, dx, dgamma and dbeta; mean and rstd stay float32.
/// The same arithmetic in float32 in the same order (every value widened on load, each result
/// narrowed once, so dgamma and dbeta sum their rows in float32 and are rounded at the end):
/// each output is to_bf16 of what the float32 kernel gives for the widened inputs.
void layer_norm_forward(kernel_context& ctx, stream s, const bf16* x, const bf16* gamma, const bf16* beta,
                        bf16* y, float* mean, float* rstd, int rows, int cols, float eps = 1e-5f);
void layer_norm_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* gamma, const float* mean,
                         const float* rstd, const bf16* dy, bf16* dx, bf16* dgamma, bf16* dbeta, int rows,
                         int cols, bool accumulate);

}  // namespace spillway::kernels

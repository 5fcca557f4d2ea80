// Layer normalisation over the last dimension of a row-major [rows, cols] matrix, with a
// learned scale (gamma) and shift (beta), forward and backward.
#pragma once

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

}  // namespace spillway::kernels

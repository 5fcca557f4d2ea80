// GEMM on row-major float32 matrices: cuBLAS on the cuda backend, OpenBLAS on the cpu backend,
// with the transposes training needs (dX = dY W^T, dW = X^T dY).
#pragma once

#include "kernels/context.hpp"

namespace spillway::kernels {

enum class transpose { no, yes };

/// C = alpha * op(A) * op(B) + beta * C, all row-major. op(A) is [m, k]: A is stored [m, k]
/// (ld >= k) or, when ta == yes, [k, m] (ld >= m). op(B) is [k, n]: B is stored [k, n] or,
/// when tb == yes, [n, k]. C is [m, n] (ldc >= n). beta == 0 ignores C's old contents (NaN too).
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
          float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

/// The same with packed matrices (leading dimension = row length as stored).
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
          float alpha, const float* a, const float* b, float beta, float* c);

/// `batch` independent GEMMs; matrix i of A starts at a + i * stride_a (likewise B, C).
void gemm_strided_batched(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n,
                          int k, float alpha, const float* a, int lda, long long stride_a,
                          const float* b, int ldb, long long stride_b, float beta, float* c,
                          int ldc, long long stride_c, int batch);

/// Linear layer: y[rows, out] = x[rows, in] * w[out, in]^T (+ bias[out] when bias != nullptr).
/// w is stored as PyTorch's nn.Linear stores it.
void linear_forward(kernel_context& ctx, stream s, const float* x, const float* w, const float* bias,
                    float* y, int rows, int in, int out);

/// Linear layer backward. dx[rows, in] = dy w (skipped when dx == nullptr);
/// dw[out, in] (+)= dy^T x; dbias[out] (+)= column sums of dy (skipped when dbias == nullptr).
/// With accumulate the weight and bias gradients are added to, else overwritten.
void linear_backward(kernel_context& ctx, stream s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* dbias, int rows, int in, int out, bool accumulate);

}  // namespace spillway::kernels

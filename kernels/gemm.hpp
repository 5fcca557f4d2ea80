// GEMM on row-major float32 matrices: cuBLAS on the cuda backend, OpenBLAS on the cpu backend,
// with the transposes training needs (dX = dY W^T, dW = X^T dY).
#pragma once

#include <cstddef>

#include "kernels/bf16.hpp"
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

// bf16 GEMM: A and B in bf16, C in float32 or bf16, alpha and beta float32, products summed in
// float32. The shapes and leading dimensions are as above. cpu backend: A and B (and C when it
// is bf16 and beta != 0) are widened, exactly, into float32 scratch from the bound workspace
// (Note [Workspace]), cblas_sgemm runs on them, and a bf16 C is rounded once at the end, so the
// result is the float32 GEMM's on the widened inputs (rounded to bf16 for a bf16 C). cuda:
// cublasGemmEx with bf16 inputs and float32 compute; its summation order is cuBLAS's.

/// Workspace a bf16 gemm or gemm_strided_batched of this shape needs bound (either C type, any
/// batch count; 0 on the cuda backend, where cuBLAS takes the binding as for float32).
[[nodiscard]] std::size_t gemm_bf16_workspace_bytes(const kernel_context& ctx, int m, int n, int k);

void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, int lda, const bf16* b, int ldb, float beta, float* c, int ldc);
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, int lda, const bf16* b, int ldb, float beta, bf16* c, int ldc);
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, const bf16* b, float beta, float* c);
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, const bf16* b, float beta, bf16* c);
void gemm_strided_batched(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
                          float alpha, const bf16* a, int lda, long long stride_a, const bf16* b, int ldb,
                          long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch);
void gemm_strided_batched(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
                          float alpha, const bf16* a, int lda, long long stride_a, const bf16* b, int ldb,
                          long long stride_b, float beta, bf16* c, int ldc, long long stride_c, int batch);

/// Workspace the bf16 linear_forward and linear_backward of this shape need bound.
[[nodiscard]] std::size_t linear_bf16_workspace_bytes(const kernel_context& ctx, int rows, int in, int out);

/// bf16 linear layer, as the float32 one. The GEMM rounds y (and dx, dw) to bf16 once; with a
/// bias, bias_add then adds it in float32 and rounds again.
void linear_forward(kernel_context& ctx, stream s, const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                    int rows, int in, int out);
void linear_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* w, const bf16* dy, bf16* dx,
                     bf16* dw, bf16* dbias, int rows, int in, int out, bool accumulate);

}  // namespace spillway::kernels

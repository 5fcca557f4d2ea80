// GEMM dispatch and the cpu backend's GEMM over OpenBLAS (cblas_sgemm, row-major).
// OpenBLAS splits a GEMM over threads by output tiles, never along k, so every output element
// is summed in the same order on every run (Note [Deterministic kernels]).
#include "kernels/gemm.hpp"

#include <cblas.h>

#include "kernels/cuda_launchers.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

CBLAS_TRANSPOSE cblas_op(transpose t) { return t == transpose::yes ? CblasTrans : CblasNoTrans; }

void check_gemm(transpose ta, transpose tb, int m, int n, int k, int lda, int ldb, int ldc) {
  SPILLWAY_KERNEL_EXPECTS(m >= 0 && n >= 0 && k >= 0, "gemm: negative size");
  SPILLWAY_KERNEL_EXPECTS(lda >= (ta == transpose::yes ? m : k) && lda >= 1, "gemm: lda too small");
  SPILLWAY_KERNEL_EXPECTS(ldb >= (tb == transpose::yes ? k : n) && ldb >= 1, "gemm: ldb too small");
  SPILLWAY_KERNEL_EXPECTS(ldc >= n && ldc >= 1, "gemm: ldc too small");
}

}  // namespace

void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
          float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_strided_batched(ctx, s, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
          float alpha, const float* a, const float* b, float beta, float* c) {
  const int lda = ta == transpose::yes ? m : k;
  const int ldb = tb == transpose::yes ? k : n;
  gemm(ctx, s, ta, tb, m, n, k, alpha, a, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, beta, c,
       n > 0 ? n : 1);
}

void gemm_strided_batched(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n,
                          int k, float alpha, const float* a, int lda, long long stride_a,
                          const float* b, int ldb, long long stride_b, float beta, float* c,
                          int ldc, long long stride_c, int batch) {
  check_gemm(ta, tb, m, n, k, lda, ldb, ldc);
  SPILLWAY_KERNEL_EXPECTS(batch >= 0, "gemm: negative batch");
  if (m == 0 || n == 0 || batch == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) {
    detail::cuda_gemm(ctx, s, ta == transpose::yes, tb == transpose::yes, m, n, k, alpha, a, lda,
                      stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
    return;
  }
#endif
  detail::enqueue_cpu(ctx, s, [=] {
    for (int i = 0; i < batch; ++i) {
      float* ci = c + i * stride_c;
      if (k == 0) {  // BLAS leaves C * beta; say so explicitly, including beta == 0 over NaN
        for (int r = 0; r < m; ++r)
          for (int col = 0; col < n; ++col)
            ci[static_cast<long long>(r) * ldc + col] =
                beta == 0.0f ? 0.0f : beta * ci[static_cast<long long>(r) * ldc + col];
        continue;
      }
      cblas_sgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), m, n, k, alpha, a + i * stride_a, lda,
                  b + i * stride_b, ldb, beta, ci, ldc);
    }
  });
}

void linear_forward(kernel_context& ctx, stream s, const float* x, const float* w, const float* bias,
                    float* y, int rows, int in, int out) {
  gemm(ctx, s, transpose::no, transpose::yes, rows, out, in, 1.0f, x, w, 0.0f, y);
  if (bias != nullptr) bias_add(ctx, s, y, bias, rows, out);
}

void linear_backward(kernel_context& ctx, stream s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* dbias, int rows, int in, int out, bool accumulate) {
  if (dx != nullptr) gemm(ctx, s, transpose::no, transpose::no, rows, in, out, 1.0f, dy, w, 0.0f, dx);
  if (dw != nullptr)
    gemm(ctx, s, transpose::yes, transpose::no, out, in, rows, 1.0f, dy, x, accumulate ? 1.0f : 0.0f, dw);
  if (dbias != nullptr) bias_backward(ctx, s, dy, dbias, rows, out, accumulate);
}

}  // namespace spillway::kernels

// The cuda backend's GEMM over cuBLAS. cuBLAS is column-major; a row-major C = op(A) op(B) is
// the column-major C^T = op(B)^T op(A)^T, so the operands swap places and keep their flags.
#include <cublas_v2.h>

#include "kernels/cuda_launchers.hpp"
#include "kernels/cuda_library_check.hpp"

namespace spillway::kernels::detail {

void cuda_gemm(kernel_context& ctx, stream s, bool ta, bool tb, int m, int n, int k, float alpha,
               const float* a, int lda, long long stride_a, const float* b, int ldb, long long stride_b,
               float beta, float* c, int ldc, long long stride_c, int batch) {
  auto* h = static_cast<cublasHandle_t>(ctx.cublas_handle());
  SPILLWAY_CUBLAS_TRY(cublasSetStream(h, static_cast<cudaStream_t>(s.handle)));
  // cublasSetStream puts cuBLAS back on its default workspace pool; give it the bound one (or
  // none) instead, so all its memory is inside the budget (Note [Workspace] in context.hpp).
  SPILLWAY_CUBLAS_TRY(cublasSetWorkspace(h, ctx.workspace_memory(), ctx.workspace_bytes()));
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    SPILLWAY_CUBLAS_TRY(cublasSgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    return;
  }
  SPILLWAY_CUBLAS_TRY(cublasSgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, stride_b, a, lda,
                                                stride_a, &beta, c, ldc, stride_c, batch));
}

}  // namespace spillway::kernels::detail

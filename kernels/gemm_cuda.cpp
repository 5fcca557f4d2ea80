// The cuda backend's GEMM over cuBLAS. cuBLAS is column-major; a row-major C = op(A) op(B) is
// the column-major C^T = op(B)^T op(A)^T, so the operands swap places and keep their flags.
// The bf16 GEMM is cublasGemmEx (bf16 A and B, float32 compute, C float32 or bf16).
#include <cublas_v2.h>

#include <type_traits>

#include "kernels/cuda_launchers.hpp"
#include "kernels/cuda_library_check.hpp"

namespace spillway::kernels::detail {
namespace {

/// The handle, on stream s, with the bound workspace.
cublasHandle_t prepared_handle(kernel_context& ctx, stream s) {
  auto* h = static_cast<cublasHandle_t>(ctx.cublas_handle());
  SPILLWAY_CUBLAS_TRY(cublasSetStream(h, static_cast<cudaStream_t>(s.handle)));
  // cublasSetStream puts cuBLAS back on its default workspace pool; give it the bound one (or
  // none) instead, so all its memory is inside the budget (Note [Workspace] in context.hpp).
  SPILLWAY_CUBLAS_TRY(cublasSetWorkspace(h, ctx.workspace_memory(), ctx.workspace_bytes()));
  return h;
}

}  // namespace

void cuda_gemm(kernel_context& ctx, stream s, bool ta, bool tb, int m, int n, int k, float alpha,
               const float* a, int lda, long long stride_a, const float* b, int ldb, long long stride_b,
               float beta, float* c, int ldc, long long stride_c, int batch) {
  cublasHandle_t h = prepared_handle(ctx, s);
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    SPILLWAY_CUBLAS_TRY(cublasSgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    return;
  }
  SPILLWAY_CUBLAS_TRY(cublasSgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, stride_b, a, lda,
                                                stride_a, &beta, c, ldc, stride_c, batch));
}

template <class TC>
void cuda_gemm_bf16(kernel_context& ctx, stream s, bool ta, bool tb, int m, int n, int k, float alpha,
                    const bf16* a, int lda, long long stride_a, const bf16* b, int ldb, long long stride_b,
                    float beta, TC* c, int ldc, long long stride_c, int batch) {
  cublasHandle_t h = prepared_handle(ctx, s);
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t c_type = std::is_same_v<TC, bf16> ? CUDA_R_16BF : CUDA_R_32F;
  // float32 compute: alpha and beta are floats, products are summed in float32.
  if (batch == 1) {
    SPILLWAY_CUBLAS_TRY(cublasGemmEx(h, op_b, op_a, n, m, k, &alpha, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda,
                                     &beta, c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  SPILLWAY_CUBLAS_TRY(cublasGemmStridedBatchedEx(h, op_b, op_a, n, m, k, &alpha, b, CUDA_R_16BF, ldb, stride_b, a,
                                                 CUDA_R_16BF, lda, stride_a, &beta, c, c_type, ldc, stride_c, batch,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template void cuda_gemm_bf16<float>(kernel_context&, stream, bool, bool, int, int, int, float, const bf16*, int,
                                    long long, const bf16*, int, long long, float, float*, int, long long, int);
template void cuda_gemm_bf16<bf16>(kernel_context&, stream, bool, bool, int, int, int, float, const bf16*, int,
                                   long long, const bf16*, int, long long, float, bf16*, int, long long, int);

}  // namespace spillway::kernels::detail

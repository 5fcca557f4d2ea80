// kernel_context in a build with CUDA: on the cuda backend it owns a cuBLAS handle and a cuDNN
// handle; on the cpu backend it holds neither. The workspace is the caller's (Note [Workspace]).
#include <cublas_v2.h>
#include <cudnn.h>

#include "device/error.hpp"
#include "kernels/context.hpp"
#include "kernels/cuda_library_check.hpp"

namespace spillway::kernels {
namespace detail {

struct cuda_handles {
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;

  ~cuda_handles() {
    if (cudnn != nullptr) (void)cudnnDestroy(cudnn);
    if (cublas != nullptr) (void)cublasDestroy(cublas);
  }
};

}  // namespace detail

kernel_context::kernel_context(Device& device) : device_(&device), backend_(device.properties().backend) {
  if (backend_ != spillway::backend::cuda) return;
  // Handles belong to the thread's current GPU, which is GPU 0 on a new thread.
  device.make_current();
  auto h = std::make_unique<detail::cuda_handles>();
  SPILLWAY_CUBLAS_TRY(cublasCreate(&h->cublas));
  // Note [Deterministic kernels]: no atomics inside cuBLAS either.
  SPILLWAY_CUBLAS_TRY(cublasSetAtomicsMode(h->cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
  // Default math (no TF32), and a bf16 GEMM with a bf16 C keeps every partial sum in float32,
  // split-k reductions included: by default cuBLAS may reduce those in the output type.
  SPILLWAY_CUBLAS_TRY(cublasSetMathMode(h->cublas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  // Note [Workspace]: cuBLAS works only in the workspace the caller binds, never in a default
  // pool of its own outside the budget. Each GEMM sets it again (cublasSetStream resets it).
  SPILLWAY_CUBLAS_TRY(cublasSetWorkspace(h->cublas, nullptr, 0));
  SPILLWAY_CUDNN_TRY(cudnnCreate(&h->cudnn));
  cuda_ = std::move(h);
}

kernel_context::~kernel_context() = default;

void* kernel_context::cublas_handle() const {
  SPILLWAY_EXPECTS_T(usage_error, cuda_ != nullptr, "cublas_handle: the context is not on the cuda backend");
  device_->make_current();  // a library call runs on the thread's current GPU
  return cuda_->cublas;
}

void* kernel_context::cudnn_handle() const {
  SPILLWAY_EXPECTS_T(usage_error, cuda_ != nullptr, "cudnn_handle: the context is not on the cuda backend");
  device_->make_current();
  return cuda_->cudnn;
}

}  // namespace spillway::kernels

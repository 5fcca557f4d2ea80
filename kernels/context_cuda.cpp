// kernel_context in a build with CUDA: on the cuda backend it owns a cuBLAS handle, a cuDNN
// handle and a growable device workspace; on the cpu backend it holds none of them.
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
  Device* device = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;

  ~cuda_handles() {
    if (workspace != nullptr) device->deallocate(workspace, workspace_bytes);
    if (cudnn != nullptr) (void)cudnnDestroy(cudnn);
    if (cublas != nullptr) (void)cublasDestroy(cublas);
  }
};

}  // namespace detail

kernel_context::kernel_context(Device& device) : device_(&device), backend_(device.properties().backend) {
  if (backend_ != spillway::backend::cuda) return;
  auto h = std::make_unique<detail::cuda_handles>();
  h->device = &device;
  SPILLWAY_CUBLAS_TRY(cublasCreate(&h->cublas));
  // Note [Deterministic kernels]: no atomics inside cuBLAS either.
  SPILLWAY_CUBLAS_TRY(cublasSetAtomicsMode(h->cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
  SPILLWAY_CUDNN_TRY(cudnnCreate(&h->cudnn));
  cuda_ = std::move(h);
}

kernel_context::~kernel_context() = default;

void* kernel_context::cublas_handle() const {
  SPILLWAY_EXPECTS(cuda_ != nullptr, "cublas_handle: the context is not on the cuda backend");
  return cuda_->cublas;
}

void* kernel_context::cudnn_handle() const {
  SPILLWAY_EXPECTS(cuda_ != nullptr, "cudnn_handle: the context is not on the cuda backend");
  return cuda_->cudnn;
}

void* kernel_context::workspace(std::size_t bytes, stream) {
  SPILLWAY_EXPECTS(cuda_ != nullptr, "workspace: the context is not on the cuda backend");
  if (bytes <= cuda_->workspace_bytes) return cuda_->workspace;
  device_->synchronize();  // earlier work on any stream may still read the old workspace
  if (cuda_->workspace != nullptr) device_->deallocate(cuda_->workspace, cuda_->workspace_bytes);
  cuda_->workspace = nullptr;
  cuda_->workspace_bytes = 0;
  cuda_->workspace = device_->allocate(bytes);
  cuda_->workspace_bytes = bytes;
  return cuda_->workspace;
}

}  // namespace spillway::kernels

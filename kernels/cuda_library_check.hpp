// SPILLWAY_CUBLAS_TRY / SPILLWAY_CUDNN_TRY: turn a cuBLAS or cuDNN status into a cuda_error
// that names the call, like SPILLWAY_CUDA_TRY does for the runtime. CUDA builds only.
#pragma once

#include <cublas_v2.h>
#include <cudnn.h>

#include <string>

#include "device/cuda_check.hpp"
#include "device/error.hpp"

namespace spillway::kernels::detail {

[[noreturn]] inline void throw_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  std::string msg = std::string(call) + " failed: " + cublasGetStatusName(status) + " (" +
                    cublasGetStatusString(status) + ") at " + file + ":" + std::to_string(line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw out_of_memory(msg);
  throw cuda_error(msg);
}

[[noreturn]] inline void throw_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  std::string msg = std::string(call) + " failed: " + cudnnGetErrorString(status) + " at " + file +
                    ":" + std::to_string(line);
  if (status == CUDNN_STATUS_ALLOC_FAILED) throw out_of_memory(msg);
  throw cuda_error(msg);
}

}  // namespace spillway::kernels::detail

#define SPILLWAY_CUBLAS_TRY(call)                                                          \
  do {                                                                                     \
    const cublasStatus_t spillway_status_ = (call);                                        \
    if (spillway_status_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::spillway::kernels::detail::throw_cublas(spillway_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define SPILLWAY_CUDNN_TRY(call)                                                           \
  do {                                                                                     \
    const cudnnStatus_t spillway_status_ = (call);                                         \
    if (spillway_status_ != CUDNN_STATUS_SUCCESS)                                          \
      ::spillway::kernels::detail::throw_cudnn(spillway_status_, #call, __FILE__, __LINE__); \
  } while (0)

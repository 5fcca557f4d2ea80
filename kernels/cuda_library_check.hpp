// SPILLWAY_CUBLAS_TRY / SPILLWAY_CUDNN_TRY: turn a cuBLAS or cuDNN status into a cuda_error
// (out_of_memory for a failed allocation) that names the call, in the location format of
// SPILLWAY_CUDA_TRY (device/error.hpp). CUDA builds only.
#pragma once

#include <cublas_v2.h>
#include <cudnn.h>

#include <string>

#include "device/cuda_check.hpp"
#include "device/error.hpp"

namespace spillway::kernels::detail {

/// What a library status says: its text, and whether it is a failed allocation.
struct library_status {
  std::string text;
  bool out_of_memory;
};

inline library_status describe(cublasStatus_t status) {
  return {std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")",
          status == CUBLAS_STATUS_ALLOC_FAILED};
}

inline library_status describe(cudnnStatus_t status) {
  return {cudnnGetErrorString(status), status == CUDNN_STATUS_ALLOC_FAILED};
}

/// Throws for a failed library call `call`; returns when the status is its library's success.
template <class Status>
void check_library(Status status, Status success, const char* call, const char* file, int line) {
  if (status == success) return;
  const library_status what = describe(status);
  const std::string msg = std::string(call) + " failed: " + what.text + ::spillway::detail::location_suffix(file, line);
  if (what.out_of_memory) throw out_of_memory(msg);
  throw cuda_error(msg);
}

}  // namespace spillway::kernels::detail

#define SPILLWAY_CUBLAS_TRY(call) \
  ::spillway::kernels::detail::check_library((call), CUBLAS_STATUS_SUCCESS, #call, __FILE__, __LINE__)

#define SPILLWAY_CUDNN_TRY(call) \
  ::spillway::kernels::detail::check_library((call), CUDNN_STATUS_SUCCESS, #call, __FILE__, __LINE__)

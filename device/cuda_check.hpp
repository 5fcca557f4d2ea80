// SPILLWAY_CUDA_TRY: turns a CUDA runtime status into an exception that names the call.
// Only files built with the CUDA toolkit include this.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "device/error.hpp"

namespace spillway::detail {
/// Throws `status` as an exception naming `call`. It first clears the runtime's last-error slot:
/// a call that fails with an error that is not sticky (out of memory, an invalid argument) leaves
/// it there, and the next launch check that reads cudaGetLastError would blame it on its own
/// kernel. A sticky error (the context is lost) keeps failing every later call regardless.
[[noreturn]] inline void throw_cuda(cudaError_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();
  std::string msg = std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ")" + location_suffix(file, line);
  if (status == cudaErrorMemoryAllocation) throw out_of_memory(msg);
  throw cuda_error(msg);
}
}  // namespace spillway::detail

#define SPILLWAY_CUDA_TRY(call)                                                          \
  do {                                                                                   \
    const cudaError_t spillway_status_ = (call);                                         \
    if (spillway_status_ != cudaSuccess)                                                 \
      ::spillway::detail::throw_cuda(spillway_status_, #call, __FILE__, __LINE__);       \
  } while (0)

// Plain CUDA for the GPU run kit (built with the cuda backend only): runtime, driver and
// library versions, and the cudaMemcpyAsync loop the cuda backend's copies are compared with.
#include "bench/plain_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <chrono>
#include <cstring>

#include "device/cuda_check.hpp"

namespace spillway::bench::plain {

cuda_facts query_cuda() {
  cuda_facts f;
  if (cudaDriverGetVersion(&f.driver_version) != cudaSuccess) f.driver_version = -1;
  if (cudaRuntimeGetVersion(&f.runtime_version) != cudaSuccess) f.runtime_version = -1;
  // The libraries answer without a device: asked first, so a machine without one still says.
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    f.cublas_version = major * 10000 + minor * 100 + patch;
  f.cudnn_version = static_cast<long>(cudnnGetVersion());
  const cudaError_t count = cudaGetDeviceCount(&f.device_count);
  if (count != cudaSuccess) {
    f.device_count = 0;
    f.device_count_error = std::string(cudaGetErrorName(count)) + ": " + cudaGetErrorString(count);
    return f;
  }
  if (f.device_count == 0) return f;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
    f.name = p.name;
    f.total_memory = p.totalGlobalMem;
    f.cc_major = p.major;
    f.cc_minor = p.minor;
  }
  std::size_t free = 0, total = 0;
  if (cudaSetDevice(0) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess) f.free_memory = free;
  return f;
}

cuda_copy_loop::cuda_copy_loop(std::size_t bytes) : bytes_(bytes) {
  SPILLWAY_CUDA_TRY(cudaMallocHost(&host_, bytes_));
  std::memset(host_, 1, bytes_);
  SPILLWAY_CUDA_TRY(cudaMalloc(&device_, bytes_));
  cudaStream_t s = nullptr;
  SPILLWAY_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
}

cuda_copy_loop::~cuda_copy_loop() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (device_ != nullptr) cudaFree(device_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

namespace {
double time_copies(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s, int copies) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < copies; ++i) SPILLWAY_CUDA_TRY(cudaMemcpyAsync(dst, src, n, kind, s));
  SPILLWAY_CUDA_TRY(cudaStreamSynchronize(s));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double cuda_copy_loop::h2d_seconds(int copies) {
  return time_copies(device_, host_, bytes_, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_), copies);
}

double cuda_copy_loop::d2h_seconds(int copies) {
  return time_copies(host_, device_, bytes_, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_), copies);
}

}  // namespace spillway::bench::plain

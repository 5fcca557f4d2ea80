// Plain CUDA for the GPU run kit: what the runtime and libraries say about the machine, and a
// plain cudaMemcpyAsync loop, the baseline the cuda backend's pinned copies are held to.
#pragma once

#include <cstddef>
#include <string>

namespace spillway::bench::plain {

/// What the CUDA runtime, cuBLAS and cuDNN report. Versions are the libraries' own numbers
/// (e.g. runtime 13000 = 13.0); -1 where the call failed. Built only with the cuda backend.
struct cuda_facts {
  int driver_version = -1;       ///< cudaDriverGetVersion: the newest CUDA the driver supports
  int runtime_version = -1;      ///< cudaRuntimeGetVersion
  int device_count = 0;          ///< cudaGetDeviceCount; 0 with device_count_error set on failure
  std::string device_count_error;
  std::string name;              ///< device 0
  std::size_t total_memory = 0;
  std::size_t free_memory = 0;
  int cc_major = 0, cc_minor = 0;
  int cublas_version = -1;       ///< cublasGetProperty major*10000 + minor*100 + patch
  long cudnn_version = -1;       ///< cudnnGetVersion
};
[[nodiscard]] cuda_facts query_cuda();

/// Pinned host memory from cudaMallocHost, device memory from cudaMalloc, one stream: what a
/// program that does nothing clever gets. Timed with host clocks around stream syncs.
class cuda_copy_loop {
 public:
  explicit cuda_copy_loop(std::size_t bytes);
  ~cuda_copy_loop();
  cuda_copy_loop(const cuda_copy_loop&) = delete;
  cuda_copy_loop& operator=(const cuda_copy_loop&) = delete;

  /// Seconds for `copies` back-to-back copies of all the bytes, host to device.
  [[nodiscard]] double h2d_seconds(int copies);
  /// The same, device to host.
  [[nodiscard]] double d2h_seconds(int copies);

 private:
  std::size_t bytes_;
  void* host_ = nullptr;
  void* device_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t, kept out of this header
};

}  // namespace spillway::bench::plain

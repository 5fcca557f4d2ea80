// What the .cu launchers share: the native stream, grid sizing for grid-stride loops, a launch
// check, and block reductions whose summation order is fixed by the block size (deterministic).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "device/cuda_check.hpp"
#include "device/device.hpp"

namespace spillway::kernels::detail {

inline cudaStream_t native(stream s) { return static_cast<cudaStream_t>(s.handle); }

inline constexpr unsigned threads_per_block = 256;

/// Blocks for a grid-stride loop over n items (capped; the loop covers the rest).
inline unsigned blocks_for(std::size_t n, unsigned threads = threads_per_block) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < (1u << 20) ? (b == 0 ? 1 : b) : (1u << 20));
}

/// Sum of v over the block, the same bits on every run: a fixed tree over shared memory.
/// Every thread gets the result. `shm` holds blockDim.x floats; blockDim.x is a power of two.
__device__ inline float block_sum(float v, float* shm) {
  shm[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shm[threadIdx.x] += shm[threadIdx.x + half];
    __syncthreads();
  }
  const float r = shm[0];
  __syncthreads();
  return r;
}

/// Maximum of v over the block; same contract as block_sum.
__device__ inline float block_max(float v, float* shm) {
  shm[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shm[threadIdx.x] = fmaxf(shm[threadIdx.x], shm[threadIdx.x + half]);
    __syncthreads();
  }
  const float r = shm[0];
  __syncthreads();
  return r;
}

/// Runs f(i) for i in [0, n), one thread per index, in a grid-stride loop.
template <class F>
__global__ void map_kernel(std::size_t n, F f) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)
    f(i);
}

/// Runs `launch` (one <<<...>>> launch) and reports the launch's own error as a cuda_error
/// naming the kernel. Note [Launch errors]: the runtime's last-error slot may still hold an
/// error that an earlier call left there and its caller tolerated (cudaErrorNotReady from
/// cudaEventQuery, a cudaMalloc failure that was caught and retried). Reading the slot only
/// after the launch would blame this kernel for it, so the slot is cleared first. A sticky
/// error (the context is broken, e.g. an earlier kernel's illegal address) is not lost: the
/// clearing read cannot reset it, the launch itself then fails with it, and it is reported.
template <class Launch>
void checked_launch(const char* kernel, const char* file, int line, const Launch& launch) {
  (void)cudaGetLastError();  // an earlier, tolerated error is not this launch's
  launch();
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    const std::string call = std::string("launch of ") + kernel;
    ::spillway::detail::throw_cuda(status, call.c_str(), file, line);
  }
}

}  // namespace spillway::kernels::detail

/// Launches a kernel and checks that launch alone: SPILLWAY_CUDA_LAUNCH("name", k<<<g, b, 0, st>>>(args)).
#define SPILLWAY_CUDA_LAUNCH(name, ...) \
  ::spillway::kernels::detail::checked_launch(name, __FILE__, __LINE__, [&] { __VA_ARGS__; })

/// Launches map_kernel over n items with functor f on stream s.
#define SPILLWAY_CUDA_MAP(name, s, n, f)                                                                \
  SPILLWAY_CUDA_LAUNCH(name, ::spillway::kernels::detail::map_kernel<<<                                 \
                                 ::spillway::kernels::detail::blocks_for(n),                            \
                                 ::spillway::kernels::detail::threads_per_block, 0,                     \
                                 ::spillway::kernels::detail::native(s)>>>((n), (f)))

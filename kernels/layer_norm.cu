// The cuda backend's layer norm: one block per row for the statistics and dx (fixed-tree
// reductions), one thread per column summing rows in order for dgamma and dbeta. Each kernel is
// a template over the storage type T (float or bf16): widen on load, narrow once on store.
#include "kernels/bf16.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

template <class T>
__global__ void layer_norm_forward_kernel(const T* x, const T* gamma, const T* beta, T* y, float* mean,
                                          float* rstd, int cols, float eps) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const T* xr = x + row * cols;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += load(xr[j]);
  const float mu = block_sum(sum, shm) / static_cast<float>(cols);
  float sq = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = load(xr[j]) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(block_sum(sq, shm) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  T* yr = y + row * cols;
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    yr[j] = store_as<T>((load(xr[j]) - mu) * rs * load(gamma[j]) + load(beta[j]));
}

template <class T>
__global__ void layer_norm_dx_kernel(const T* x, const T* gamma, const float* mean, const float* rstd, const T* dy,
                                     T* dx, int cols) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const T* xr = x + row * cols;
  const T* dyr = dy + row * cols;
  const float mu = mean[row];
  const float rs = rstd[row];
  float a = 0.0f;
  float b = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float dyg = load(dyr[j]) * load(gamma[j]);
    a += dyg;
    b += dyg * (load(xr[j]) - mu) * rs;
  }
  a = block_sum(a, shm);
  b = block_sum(b, shm);
  T* dxr = dx + row * cols;
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    dxr[j] = store_as<T>(
        ops::layer_norm_dx(load(dyr[j]) * load(gamma[j]), (load(xr[j]) - mu) * rs, rs, a, b, static_cast<float>(cols)));
}

/// Column j of dgamma and dbeta summed over the rows in order by one thread; a grid-stride loop
/// over the columns, since blocks_for caps the grid.
template <class T>
__global__ void layer_norm_params_kernel(const T* x, const float* mean, const float* rstd, const T* dy, T* dgamma,
                                         T* dbeta, int rows, std::size_t cols, bool accumulate) {
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    float g = accumulate ? load(dgamma[j]) : 0.0f;
    float b = accumulate ? load(dbeta[j]) : 0.0f;
    for (int r = 0; r < rows; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * cols + j;
      g += load(dy[at]) * (load(x[at]) - mean[r]) * rstd[r];
      b += load(dy[at]);
    }
    dgamma[j] = store_as<T>(g);
    dbeta[j] = store_as<T>(b);
  }
}

}  // namespace

template <class T>
void cuda_layer_norm_forward(kernel_context&, stream s, const T* x, const T* gamma, const T* beta, T* y,
                             float* mean, float* rstd, int rows, int cols, float eps) {
  SPILLWAY_CUDA_LAUNCH("layer_norm_forward_kernel",
                       layer_norm_forward_kernel<T><<<rows, threads_per_block, 0, native(s)>>>(
                           x, gamma, beta, y, mean, rstd, cols, eps));
}

template <class T>
void cuda_layer_norm_backward(kernel_context&, stream s, const T* x, const T* gamma, const float* mean,
                              const float* rstd, const T* dy, T* dx, T* dgamma, T* dbeta, int rows, int cols,
                              bool accumulate) {
  if (rows > 0) {
    SPILLWAY_CUDA_LAUNCH("layer_norm_dx_kernel",
                         layer_norm_dx_kernel<T><<<rows, threads_per_block, 0, native(s)>>>(
                             x, gamma, mean, rstd, dy, dx, cols));
  }
  const auto c = static_cast<std::size_t>(cols);
  SPILLWAY_CUDA_LAUNCH("layer_norm_params_kernel",
                       layer_norm_params_kernel<T><<<blocks_for(c), threads_per_block, 0, native(s)>>>(
                           x, mean, rstd, dy, dgamma, dbeta, rows, c, accumulate));
}

#define SPILLWAY_LAYER_NORM_LAUNCHERS(T)                                                                     \
  template void cuda_layer_norm_forward<T>(kernel_context&, stream, const T*, const T*, const T*, T*, float*, \
                                           float*, int, int, float);                                         \
  template void cuda_layer_norm_backward<T>(kernel_context&, stream, const T*, const T*, const float*,        \
                                            const float*, const T*, T*, T*, T*, int, int, bool);
SPILLWAY_LAYER_NORM_LAUNCHERS(float)
SPILLWAY_LAYER_NORM_LAUNCHERS(bf16)
#undef SPILLWAY_LAYER_NORM_LAUNCHERS

}  // namespace spillway::kernels::detail

// The cuda backend's layer norm: one block per row for the statistics and dx (fixed-tree
// reductions), one thread per column summing rows in order for dgamma and dbeta.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta, float* y,
                                          float* mean, float* rstd, int cols, float eps) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += xr[j];
  const float mu = block_sum(sum, shm) / static_cast<float>(cols);
  float sq = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float d = xr[j] - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(block_sum(sq, shm) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  float* yr = y + row * cols;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
}

__global__ void layer_norm_dx_kernel(const float* x, const float* gamma, const float* mean, const float* rstd,
                                     const float* dy, float* dx, int cols) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  const float mu = mean[row];
  const float rs = rstd[row];
  float a = 0.0f;
  float b = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float dyg = dyr[j] * gamma[j];
    a += dyg;
    b += dyg * (xr[j] - mu) * rs;
  }
  a = block_sum(a, shm);
  b = block_sum(b, shm);
  float* dxr = dx + row * cols;
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    dxr[j] = ops::layer_norm_dx(dyr[j] * gamma[j], (xr[j] - mu) * rs, rs, a, b, static_cast<float>(cols));
}

__global__ void layer_norm_params_kernel(const float* x, const float* mean, const float* rstd, const float* dy,
                                         float* dgamma, float* dbeta, int rows, int cols, bool accumulate) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float g = accumulate ? dgamma[j] : 0.0f;
  float b = accumulate ? dbeta[j] : 0.0f;
  for (int r = 0; r < rows; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * cols + j;
    g += dy[at] * (x[at] - mean[r]) * rstd[r];
    b += dy[at];
  }
  dgamma[j] = g;
  dbeta[j] = b;
}

}  // namespace

void cuda_layer_norm_forward(kernel_context&, stream s, const float* x, const float* gamma, const float* beta,
                             float* y, float* mean, float* rstd, int rows, int cols, float eps) {
  SPILLWAY_CUDA_LAUNCH("layer_norm_forward_kernel",
                       layer_norm_forward_kernel<<<rows, threads_per_block, 0, native(s)>>>(
                           x, gamma, beta, y, mean, rstd, cols, eps));
}

void cuda_layer_norm_backward(kernel_context&, stream s, const float* x, const float* gamma, const float* mean,
                              const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta,
                              int rows, int cols, bool accumulate) {
  if (rows > 0) {
    SPILLWAY_CUDA_LAUNCH("layer_norm_dx_kernel",
                         layer_norm_dx_kernel<<<rows, threads_per_block, 0, native(s)>>>(
                             x, gamma, mean, rstd, dy, dx, cols));
  }
  const unsigned grid = blocks_for(static_cast<std::size_t>(cols));
  SPILLWAY_CUDA_LAUNCH("layer_norm_params_kernel",
                       layer_norm_params_kernel<<<grid, threads_per_block, 0, native(s)>>>(
                           x, mean, rstd, dy, dgamma, dbeta, rows, cols, accumulate));
}

}  // namespace spillway::kernels::detail

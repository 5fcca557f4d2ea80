// The cuda backend's global average pooling and per-channel bias (used by conv2d): one thread
// per plane, or one block per channel with a fixed-tree sum, so results repeat bit for bit.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"

namespace spillway::kernels::detail {
namespace {

__global__ void global_avg_pool_kernel(const float* x, float* y, std::size_t planes, int plane) {
  const std::size_t pl = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (pl >= planes) return;
  const float* in = x + pl * plane;
  float sum = 0.0f;
  for (int i = 0; i < plane; ++i) sum += in[i];
  y[pl] = sum / static_cast<float>(plane);
}

struct spread_f {
  const float* dy;
  float* dx;
  std::size_t plane;
  __device__ void operator()(std::size_t i) const { dx[i] = dy[i / plane] / static_cast<float>(plane); }
};

struct channel_bias_f {
  float* y;
  const float* bias;
  std::size_t plane;
  std::size_t channels;
  __device__ void operator()(std::size_t i) const { y[i] += bias[(i / plane) % channels]; }
};

__global__ void channel_bias_backward_kernel(const float* dy, float* dbias, int batch, int channels, int plane,
                                             bool accumulate) {
  __shared__ float shm[threads_per_block];
  const int c = blockIdx.x;
  float sum = 0.0f;
  for (int n = 0; n < batch; ++n) {
    const float* g = dy + (static_cast<std::size_t>(n) * channels + c) * plane;
    for (int i = threadIdx.x; i < plane; i += blockDim.x) sum += g[i];
  }
  sum = block_sum(sum, shm);
  if (threadIdx.x == 0) dbias[c] = accumulate ? dbias[c] + sum : sum;
}

}  // namespace

void cuda_global_avg_pool_forward(kernel_context&, stream s, const float* x, float* y, int batch, int channels,
                                  int plane) {
  const std::size_t planes = static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels);
  SPILLWAY_CUDA_LAUNCH("global_avg_pool_kernel",
                       global_avg_pool_kernel<<<blocks_for(planes), threads_per_block, 0, native(s)>>>(
                           x, y, planes, plane));
}

void cuda_global_avg_pool_backward(kernel_context&, stream s, const float* dy, float* dx, int batch, int channels,
                                   int plane) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels) * plane;
  SPILLWAY_CUDA_MAP("global_avg_pool_spread", s, n, (spread_f{dy, dx, static_cast<std::size_t>(plane)}));
}

void cuda_channel_bias_add(kernel_context&, stream s, float* y, const float* bias, int batch, int channels,
                           int plane) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels) * plane;
  SPILLWAY_CUDA_MAP("channel_bias_add", s, n,
                    (channel_bias_f{y, bias, static_cast<std::size_t>(plane), static_cast<std::size_t>(channels)}));
}

void cuda_channel_bias_backward(kernel_context&, stream s, const float* dy, float* dbias, int batch, int channels,
                                int plane, bool accumulate) {
  SPILLWAY_CUDA_LAUNCH("channel_bias_backward_kernel",
                       channel_bias_backward_kernel<<<channels, threads_per_block, 0, native(s)>>>(
                           dy, dbias, batch, channels, plane, accumulate));
}

}  // namespace spillway::kernels::detail

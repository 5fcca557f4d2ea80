// The cuda backend's pooling and per-channel bias (used by conv2d), templates over the storage
// type T (float or bf16): max pooling as one thread per output (forward) and per input element
// (backward, gathering its windows in row-major order, as the cpu adds them), global average
// pooling as one thread per plane, the bias gradient as one block per channel with a fixed-tree
// sum, so results repeat bit for bit.
#include "kernels/bf16.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/pool_window.hpp"

namespace spillway::kernels::detail {
namespace {

template <class T>
struct max_pool_f {
  pool_plane z;
  const T* x;
  T* y;
  __device__ void operator()(std::size_t i) const {
    const std::size_t out = static_cast<std::size_t>(z.out_height * z.out_width);
    const std::size_t pl = i / out;
    const long pq = static_cast<long>(i % out);
    const T* plane = x + pl * static_cast<std::size_t>(z.height * z.width);
    y[i] = plane[pool_argmax(z, plane, pq / z.out_width, pq % z.out_width)];
  }
};

template <class T>
struct max_pool_grad_f {
  pool_plane z;
  const T* x;
  const T* dy;
  T* dx;
  __device__ void operator()(std::size_t i) const {
    const std::size_t in = static_cast<std::size_t>(z.height * z.width);
    const std::size_t pl = i / in;
    const long at = static_cast<long>(i % in);
    dx[i] = store_as<T>(pool_gather_grad(z, x + pl * in, dy + pl * static_cast<std::size_t>(z.out_height * z.out_width),
                                         at / z.width, at % z.width));
  }
};

/// Plane pl summed in order by one thread; a grid-stride loop over the planes, since blocks_for
/// caps the grid.
template <class T>
__global__ void global_avg_pool_kernel(const T* x, T* y, std::size_t planes, int plane) {
  for (std::size_t pl = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; pl < planes;
       pl += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    const T* in = x + pl * static_cast<std::size_t>(plane);
    float sum = 0.0f;
    for (int i = 0; i < plane; ++i) sum += load(in[i]);
    y[pl] = store_as<T>(sum / static_cast<float>(plane));
  }
}

template <class T>
struct spread_f {
  const T* dy;
  T* dx;
  std::size_t plane;
  __device__ void operator()(std::size_t i) const {
    dx[i] = store_as<T>(load(dy[i / plane]) / static_cast<float>(plane));
  }
};

template <class T>
struct channel_bias_f {
  T* y;
  const T* bias;
  std::size_t plane;
  std::size_t channels;
  __device__ void operator()(std::size_t i) const { y[i] = store_as<T>(load(y[i]) + load(bias[(i / plane) % channels])); }
};

template <class T>
__global__ void channel_bias_backward_kernel(const T* dy, T* dbias, int batch, int channels, int plane,
                                             bool accumulate) {
  __shared__ float shm[threads_per_block];
  const int c = blockIdx.x;
  float sum = 0.0f;
  for (int n = 0; n < batch; ++n) {
    const T* g = dy + (static_cast<std::size_t>(n) * channels + c) * plane;
    for (int i = threadIdx.x; i < plane; i += blockDim.x) sum += load(g[i]);
  }
  sum = block_sum(sum, shm);
  if (threadIdx.x == 0) dbias[c] = store_as<T>(accumulate ? load(dbias[c]) + sum : sum);
}

pool_plane plane_of(const pool2d_shape& sh) {
  return {sh.height, sh.width, sh.out_height(), sh.out_width(), sh.window.size, sh.window.stride, sh.window.pad};
}

}  // namespace

template <class T>
void cuda_max_pool2d_forward(kernel_context&, stream s, const pool2d_shape& shape, const T* x, T* y) {
  const pool_plane z = plane_of(shape);
  const std::size_t n = static_cast<std::size_t>(shape.batch) * static_cast<std::size_t>(shape.channels) *
                        static_cast<std::size_t>(z.out_height * z.out_width);
  SPILLWAY_CUDA_MAP("max_pool2d_forward", s, n, (max_pool_f<T>{z, x, y}));
}

template <class T>
void cuda_max_pool2d_backward(kernel_context&, stream s, const pool2d_shape& shape, const T* x, const T*,
                              const T* dy, T* dx) {
  const pool_plane z = plane_of(shape);
  const std::size_t n = static_cast<std::size_t>(shape.batch) * static_cast<std::size_t>(shape.channels) *
                        static_cast<std::size_t>(z.height * z.width);
  SPILLWAY_CUDA_MAP("max_pool2d_backward", s, n, (max_pool_grad_f<T>{z, x, dy, dx}));
}

template <class T>
void cuda_global_avg_pool_forward(kernel_context&, stream s, const T* x, T* y, int batch, int channels, int plane) {
  const std::size_t planes = static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels);
  SPILLWAY_CUDA_LAUNCH("global_avg_pool_kernel",
                       global_avg_pool_kernel<T><<<blocks_for(planes), threads_per_block, 0, native(s)>>>(
                           x, y, planes, plane));
}

template <class T>
void cuda_global_avg_pool_backward(kernel_context&, stream s, const T* dy, T* dx, int batch, int channels,
                                   int plane) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels) * plane;
  SPILLWAY_CUDA_MAP("global_avg_pool_spread", s, n, (spread_f<T>{dy, dx, static_cast<std::size_t>(plane)}));
}

template <class T>
void cuda_channel_bias_add(kernel_context&, stream s, T* y, const T* bias, int batch, int channels, int plane) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels) * plane;
  SPILLWAY_CUDA_MAP("channel_bias_add", s, n,
                    (channel_bias_f<T>{y, bias, static_cast<std::size_t>(plane), static_cast<std::size_t>(channels)}));
}

template <class T>
void cuda_channel_bias_backward(kernel_context&, stream s, const T* dy, T* dbias, int batch, int channels, int plane,
                                bool accumulate) {
  SPILLWAY_CUDA_LAUNCH("channel_bias_backward_kernel",
                       channel_bias_backward_kernel<T><<<channels, threads_per_block, 0, native(s)>>>(
                           dy, dbias, batch, channels, plane, accumulate));
}

#define SPILLWAY_POOLING_LAUNCHERS(T)                                                                              \
  template void cuda_max_pool2d_forward<T>(kernel_context&, stream, const pool2d_shape&, const T*, T*);            \
  template void cuda_max_pool2d_backward<T>(kernel_context&, stream, const pool2d_shape&, const T*, const T*,      \
                                            const T*, T*);                                                         \
  template void cuda_global_avg_pool_forward<T>(kernel_context&, stream, const T*, T*, int, int, int);             \
  template void cuda_global_avg_pool_backward<T>(kernel_context&, stream, const T*, T*, int, int, int);            \
  template void cuda_channel_bias_add<T>(kernel_context&, stream, T*, const T*, int, int, int);                    \
  template void cuda_channel_bias_backward<T>(kernel_context&, stream, const T*, T*, int, int, int, bool);
SPILLWAY_POOLING_LAUNCHERS(float)
SPILLWAY_POOLING_LAUNCHERS(bf16)
#undef SPILLWAY_POOLING_LAUNCHERS

}  // namespace spillway::kernels::detail

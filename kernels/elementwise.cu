// The cuda backend's elementwise kernels: the map kernel over the functors of
// kernels/elementwise_ops.hpp (the cpu launchers run the same), bias add, and bias backward as
// one thread per column summing rows in order.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/elementwise_ops.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

struct bias_add_f {
  float* y;
  const float* bias;
  std::size_t cols;
  __device__ void operator()(std::size_t i) const { y[i] += bias[i % cols]; }
};

__global__ void bias_backward_kernel(const float* dy, float* dbias, int rows, int cols, bool accumulate) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float sum = accumulate ? dbias[j] : 0.0f;
  for (int r = 0; r < rows; ++r) sum += dy[static_cast<std::size_t>(r) * cols + j];
  dbias[j] = sum;
}

}  // namespace

void cuda_bias_add(kernel_context&, stream s, float* y, const float* bias, int rows, int cols) {
  const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  SPILLWAY_CUDA_MAP("bias_add", s, n, (bias_add_f{y, bias, static_cast<std::size_t>(cols)}));
}

void cuda_bias_backward(kernel_context&, stream s, const float* dy, float* dbias, int rows, int cols,
                        bool accumulate) {
  const unsigned grid = blocks_for(static_cast<std::size_t>(cols));
  SPILLWAY_CUDA_LAUNCH("bias_backward_kernel",
                       bias_backward_kernel<<<grid, threads_per_block, 0, native(s)>>>(
                           dy, dbias, rows, cols, accumulate));
}

template <class F>
void cuda_map(const char* kernel, stream s, std::size_t n, const F& f) {
  SPILLWAY_CUDA_MAP(kernel, s, n, f);
}

#define SPILLWAY_INSTANTIATE_CUDA_MAP(F) template void cuda_map<F>(const char*, stream, std::size_t, const F&);
SPILLWAY_ELEMENTWISE_FUNCTORS(SPILLWAY_INSTANTIATE_CUDA_MAP)
#undef SPILLWAY_INSTANTIATE_CUDA_MAP

}  // namespace spillway::kernels::detail

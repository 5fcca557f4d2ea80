// The cuda backend's elementwise kernels: functors over the shared SPILLWAY_HD bodies of
// kernels/ops.hpp, and bias backward as one thread per column summing rows in order.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

struct bias_add_f {
  float* y;
  const float* bias;
  std::size_t cols;
  __device__ void operator()(std::size_t i) const { y[i] += bias[i % cols]; }
};
struct gelu_f {
  const float* x;
  float* y;
  __device__ void operator()(std::size_t i) const { y[i] = ops::gelu(x[i]); }
};
struct gelu_grad_f {
  const float* x;
  const float* dy;
  float* dx;
  __device__ void operator()(std::size_t i) const { dx[i] = dy[i] * ops::gelu_grad(x[i]); }
};
struct relu_f {
  const float* x;
  float* y;
  __device__ void operator()(std::size_t i) const { y[i] = ops::relu(x[i]); }
};
struct relu_grad_f {
  const float* x;
  const float* dy;
  float* dx;
  __device__ void operator()(std::size_t i) const { dx[i] = dy[i] * ops::relu_grad(x[i]); }
};
struct add_f {
  const float* a;
  const float* b;
  float* y;
  __device__ void operator()(std::size_t i) const { y[i] = a[i] + b[i]; }
};
struct scale_f {
  const float* x;
  float alpha;
  float* y;
  __device__ void operator()(std::size_t i) const { y[i] = alpha * x[i]; }
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

void cuda_gelu_forward(kernel_context&, stream s, const float* x, float* y, std::size_t n) {
  SPILLWAY_CUDA_MAP("gelu", s, n, (gelu_f{x, y}));
}
void cuda_gelu_backward(kernel_context&, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  SPILLWAY_CUDA_MAP("gelu_grad", s, n, (gelu_grad_f{x, dy, dx}));
}
void cuda_relu_forward(kernel_context&, stream s, const float* x, float* y, std::size_t n) {
  SPILLWAY_CUDA_MAP("relu", s, n, (relu_f{x, y}));
}
void cuda_relu_backward(kernel_context&, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  SPILLWAY_CUDA_MAP("relu_grad", s, n, (relu_grad_f{x, dy, dx}));
}
void cuda_add(kernel_context&, stream s, const float* a, const float* b, float* y, std::size_t n) {
  SPILLWAY_CUDA_MAP("add", s, n, (add_f{a, b, y}));
}
void cuda_scale(kernel_context&, stream s, const float* x, float alpha, float* y, std::size_t n) {
  SPILLWAY_CUDA_MAP("scale", s, n, (scale_f{x, alpha, y}));
}

}  // namespace spillway::kernels::detail

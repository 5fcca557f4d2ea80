// Dispatch and cpu launchers of the elementwise kernels; the math is the SPILLWAY_HD bodies of
// kernels/ops.hpp, the same the CUDA kernels in elementwise.cu run.
#include "kernels/elementwise.hpp"

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {
namespace {

constexpr std::size_t elementwise_grain = 1u << 14;

template <class F>
void cpu_map(kernel_context& ctx, stream s, std::size_t n, F f) {
  detail::enqueue_cpu(ctx, s, [=] {
    detail::parallel_for(n, elementwise_grain, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) f(i);
    });
  });
}

}  // namespace

void bias_add(kernel_context& ctx, stream s, float* y, const float* bias, int rows, int cols) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols >= 0, "bias_add");
  if (rows == 0 || cols == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_bias_add(ctx, s, y, bias, rows, cols);
#endif
  const auto c = static_cast<std::size_t>(cols);
  detail::enqueue_cpu(ctx, s, [=] {
    detail::parallel_for(static_cast<std::size_t>(rows), detail::grain_for(c), [&](std::size_t b, std::size_t e) {
      for (std::size_t r = b; r < e; ++r)
        for (std::size_t j = 0; j < c; ++j) y[r * c + j] += bias[j];
    });
  });
}

void bias_backward(kernel_context& ctx, stream s, const float* dy, float* dbias, int rows, int cols,
                   bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols >= 0, "bias_backward");
  if (cols == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_bias_backward(ctx, s, dy, dbias, rows, cols, accumulate);
#endif
  const auto c = static_cast<std::size_t>(cols);
  const auto nr = static_cast<std::size_t>(rows);
  detail::enqueue_cpu(ctx, s, [=] {
    // Parallel over column blocks; each column is summed over rows in order by one thread.
    detail::parallel_for(c, 64, [&](std::size_t b, std::size_t e) {
      for (std::size_t j = b; j < e; ++j)
        if (!accumulate) dbias[j] = 0.0f;
      for (std::size_t r = 0; r < nr; ++r)
        for (std::size_t j = b; j < e; ++j) dbias[j] += dy[r * c + j];
    });
  });
}

void gelu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n) {
  if (n == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_gelu_forward(ctx, s, x, y, n);
#endif
  cpu_map(ctx, s, n, [=](std::size_t i) { y[i] = ops::gelu(x[i]); });
}

void gelu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  if (n == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_gelu_backward(ctx, s, x, dy, dx, n);
#endif
  cpu_map(ctx, s, n, [=](std::size_t i) { dx[i] = dy[i] * ops::gelu_grad(x[i]); });
}

void relu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n) {
  if (n == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_relu_forward(ctx, s, x, y, n);
#endif
  cpu_map(ctx, s, n, [=](std::size_t i) { y[i] = ops::relu(x[i]); });
}

void relu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  if (n == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_relu_backward(ctx, s, x, dy, dx, n);
#endif
  cpu_map(ctx, s, n, [=](std::size_t i) { dx[i] = dy[i] * ops::relu_grad(x[i]); });
}

void add(kernel_context& ctx, stream s, const float* a, const float* b, float* y, std::size_t n) {
  if (n == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_add(ctx, s, a, b, y, n);
#endif
  cpu_map(ctx, s, n, [=](std::size_t i) { y[i] = a[i] + b[i]; });
}

void scale(kernel_context& ctx, stream s, const float* x, float alpha, float* y, std::size_t n) {
  if (n == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_scale(ctx, s, x, alpha, y, n);
#endif
  cpu_map(ctx, s, n, [=](std::size_t i) { y[i] = alpha * x[i]; });
}

}  // namespace spillway::kernels

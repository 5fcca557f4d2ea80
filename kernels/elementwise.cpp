// Dispatch and cpu launchers of the elementwise kernels; the math is the SPILLWAY_HD bodies of
// kernels/ops.hpp, the same the CUDA kernels in elementwise.cu run.
#include "kernels/elementwise.hpp"

#include "kernels/cuda_launchers.hpp"
#include "kernels/elementwise_ops.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {
namespace {

constexpr std::size_t elementwise_grain = 1u << 14;

/// The dispatch of every elementwise kernel: f(i) (an elementwise_ops.hpp functor) for every
/// i < n, by the CUDA map kernel or on the cpu in fixed chunks.
template <class F>
void map(kernel_context& ctx, stream s, [[maybe_unused]] const char* kernel, std::size_t n, const F& f) {
  if (n == 0) return;
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_map(kernel, s, n, f), [=] {
    detail::parallel_for(n, elementwise_grain, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) f(i);
    });
  });
}

}  // namespace

void bias_add(kernel_context& ctx, stream s, float* y, const float* bias, int rows, int cols) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols >= 0, "bias_add");
  if (rows == 0 || cols == 0) return;
  const auto c = static_cast<std::size_t>(cols);
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_bias_add(ctx, s, y, bias, rows, cols), [=] {
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
  const auto c = static_cast<std::size_t>(cols);
  const auto nr = static_cast<std::size_t>(rows);
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_bias_backward(ctx, s, dy, dbias, rows, cols, accumulate), [=] {
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
  map(ctx, s, "gelu", n, ops::activation_f<ops::gelu_act>{x, y});
}

void gelu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  map(ctx, s, "gelu_grad", n, ops::activation_grad_f<ops::gelu_act>{x, dy, dx});
}

void relu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n) {
  map(ctx, s, "relu", n, ops::activation_f<ops::relu_act>{x, y});
}

void relu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  map(ctx, s, "relu_grad", n, ops::activation_grad_f<ops::relu_act>{x, dy, dx});
}

void add(kernel_context& ctx, stream s, const float* a, const float* b, float* y, std::size_t n) {
  map(ctx, s, "add", n, ops::add_f{a, b, y});
}

void scale(kernel_context& ctx, stream s, const float* x, float alpha, float* y, std::size_t n) {
  map(ctx, s, "scale", n, ops::scale_f{x, alpha, y});
}

}  // namespace spillway::kernels

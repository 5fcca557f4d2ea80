// Dispatch and cpu launchers of the elementwise kernels; the math is the SPILLWAY_HD functors of
// kernels/elementwise_ops.hpp, the same the CUDA kernels in elementwise.cu run, templated on the
// storage type (float or bf16) so both precisions share one body.
#include "kernels/elementwise.hpp"

#include "kernels/cuda_launchers.hpp"
#include "kernels/elementwise_ops.hpp"
#include "kernels/host_exp.hpp"
#include "kernels/launch.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels {
namespace {

constexpr std::size_t elementwise_grain = 1u << 14;
constexpr std::size_t bias_columns_per_pass = 64;

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

/// GELU (dy null) or its gradient times dy, the cuda map kernel over the ops.hpp functor, or
/// on the cpu a chunk at a time: the chunk's exponentials at once (Note [Host exponentials]),
/// then the same math from them. y may alias x or dy: a chunk is read before it is written.
template <class T>
void gelu_t(kernel_context& ctx, stream s, const T* x, const T* dy, T* y, std::size_t n) {
  if (n == 0) return;
  constexpr std::size_t chunk = 256;
  SPILLWAY_KERNEL_LAUNCH(ctx, s,
                         dy == nullptr ? detail::cuda_map("gelu", s, n, ops::gelu_f<T>{x, y})
                                       : detail::cuda_map("gelu_grad", s, n, ops::gelu_grad_f<T>{x, dy, y}),
                         [=] {
    detail::parallel_for(n, elementwise_grain, [&](std::size_t b, std::size_t e) {
      // Whole chunks (the last one padded with zeros), so the loops over a chunk have a fixed
      // count and the compiler turns them into vector code; each element's math is unchanged.
      float xs[chunk], ex[chunk];
      for (std::size_t i0 = b; i0 < e; i0 += chunk) {
        const std::size_t m = e - i0 < chunk ? e - i0 : chunk;
        for (std::size_t k = 0; k < m; ++k) xs[k] = load(x[i0 + k]);
        for (std::size_t k = m; k < chunk; ++k) xs[k] = 0.0f;
        for (std::size_t k = 0; k < chunk; ++k) ex[k] = ops::gelu_exp_arg(xs[k]);
        detail::exp_in_place(ex, chunk);
        if (dy == nullptr) {
          for (std::size_t k = 0; k < chunk; ++k) ex[k] = ops::gelu_of(xs[k], ex[k]);
        } else {
          for (std::size_t k = 0; k < chunk; ++k) ex[k] = ops::gelu_grad_of(xs[k], ex[k]);
          for (std::size_t k = 0; k < m; ++k) ex[k] = load(dy[i0 + k]) * ex[k];
        }
        for (std::size_t k = 0; k < m; ++k) y[i0 + k] = store_as<T>(ex[k]);
      }
    });
  });
}

template <class T>
void bias_add_t(kernel_context& ctx, stream s, T* y, const T* bias, int rows, int cols) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols >= 0, "bias_add");
  if (rows == 0 || cols == 0) return;
  const auto c = static_cast<std::size_t>(cols);
  const ops::bias_add_f<T> f{y, bias, c};
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_map("bias_add", s, static_cast<std::size_t>(rows) * c, f), [=] {
    detail::parallel_for(static_cast<std::size_t>(rows), detail::grain_for(c), [&](std::size_t b, std::size_t e) {
      for (std::size_t r = b; r < e; ++r)
        for (std::size_t j = 0; j < c; ++j) f.add_bias(r * c + j, j);
    });
  });
}

template <class T>
void bias_backward_t(kernel_context& ctx, stream s, const T* dy, T* dbias, int rows, int cols, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(rows >= 0 && cols >= 0, "bias_backward");
  if (cols == 0) return;
  const auto c = static_cast<std::size_t>(cols);
  const auto nr = static_cast<std::size_t>(rows);
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_bias_backward(ctx, s, dy, dbias, rows, cols, accumulate), [=] {
    // Parallel over column blocks; each column is summed in float32 over rows in order by one
    // thread (the order the cuda kernel uses), then stored once.
    detail::parallel_for(c, bias_columns_per_pass, [&](std::size_t b, std::size_t e) {
      for (std::size_t j0 = b; j0 < e; j0 += bias_columns_per_pass) {
        const std::size_t j1 = j0 + bias_columns_per_pass < e ? j0 + bias_columns_per_pass : e;
        float sum[bias_columns_per_pass];
        for (std::size_t j = j0; j < j1; ++j) sum[j - j0] = accumulate ? load(dbias[j]) : 0.0f;
        for (std::size_t r = 0; r < nr; ++r)
          for (std::size_t j = j0; j < j1; ++j) sum[j - j0] += load(dy[r * c + j]);
        for (std::size_t j = j0; j < j1; ++j) dbias[j] = store_as<T>(sum[j - j0]);
      }
    });
  });
}

}  // namespace

void convert(kernel_context& ctx, stream s, const float* x, bf16* y, std::size_t n) {
  map(ctx, s, "convert to bf16", n, ops::narrow_f{x, y});
}
void convert(kernel_context& ctx, stream s, const bf16* x, float* y, std::size_t n) {
  map(ctx, s, "convert to float", n, ops::widen_f{x, y});
}

void bias_add(kernel_context& ctx, stream s, float* y, const float* bias, int rows, int cols) {
  bias_add_t(ctx, s, y, bias, rows, cols);
}
void bias_add(kernel_context& ctx, stream s, bf16* y, const bf16* bias, int rows, int cols) {
  bias_add_t(ctx, s, y, bias, rows, cols);
}

void bias_backward(kernel_context& ctx, stream s, const float* dy, float* dbias, int rows, int cols,
                   bool accumulate) {
  bias_backward_t(ctx, s, dy, dbias, rows, cols, accumulate);
}
void bias_backward(kernel_context& ctx, stream s, const bf16* dy, bf16* dbias, int rows, int cols,
                   bool accumulate) {
  bias_backward_t(ctx, s, dy, dbias, rows, cols, accumulate);
}

void gelu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n) {
  gelu_t<float>(ctx, s, x, nullptr, y, n);
}
void gelu_forward(kernel_context& ctx, stream s, const bf16* x, bf16* y, std::size_t n) {
  gelu_t<bf16>(ctx, s, x, nullptr, y, n);
}

void gelu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  gelu_t<float>(ctx, s, x, dy, dx, n);
}
void gelu_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* dy, bf16* dx, std::size_t n) {
  gelu_t<bf16>(ctx, s, x, dy, dx, n);
}

void relu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n) {
  map(ctx, s, "relu", n, ops::relu_f<float>{x, y});
}
void relu_forward(kernel_context& ctx, stream s, const bf16* x, bf16* y, std::size_t n) {
  map(ctx, s, "relu", n, ops::relu_f<bf16>{x, y});
}

void relu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n) {
  map(ctx, s, "relu_grad", n, ops::relu_grad_f<float>{x, dy, dx});
}
void relu_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* dy, bf16* dx, std::size_t n) {
  map(ctx, s, "relu_grad", n, ops::relu_grad_f<bf16>{x, dy, dx});
}

void add(kernel_context& ctx, stream s, const float* a, const float* b, float* y, std::size_t n) {
  map(ctx, s, "add", n, ops::add_f<float>{a, b, y});
}
void add(kernel_context& ctx, stream s, const bf16* a, const bf16* b, bf16* y, std::size_t n) {
  map(ctx, s, "add", n, ops::add_f<bf16>{a, b, y});
}

void scale(kernel_context& ctx, stream s, const float* x, float alpha, float* y, std::size_t n) {
  map(ctx, s, "scale", n, ops::scale_f<float>{x, alpha, y});
}
void scale(kernel_context& ctx, stream s, const bf16* x, float alpha, bf16* y, std::size_t n) {
  map(ctx, s, "scale", n, ops::scale_f<bf16>{x, alpha, y});
}

}  // namespace spillway::kernels

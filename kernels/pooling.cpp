// Dispatch and cpu launchers of max pooling and global average pooling: planes in parallel,
// each plane handled in a fixed order by one thread.
#include "kernels/pooling.hpp"

#include <cstring>
#include <limits>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

void check(const pool2d_shape& sh, const char* kernel) {
  SPILLWAY_KERNEL_EXPECTS(sh.batch >= 0 && sh.channels > 0 && sh.window > 0 && sh.stride > 0 &&
                              sh.pad >= 0 && sh.pad < sh.window && sh.height + 2 * sh.pad >= sh.window &&
                              sh.width + 2 * sh.pad >= sh.window,
                          kernel);
}

/// Index in the plane of the maximum of window (p, q): the first in row-major window order.
std::size_t argmax(const pool2d_shape& sh, const float* plane, long p, long q) {
  float best = -std::numeric_limits<float>::infinity();
  std::size_t where = 0;
  bool found = false;
  for (long i = 0; i < sh.window; ++i) {
    const long y = p * sh.stride - sh.pad + i;
    if (y < 0 || y >= sh.height) continue;
    for (long j = 0; j < sh.window; ++j) {
      const long x = q * sh.stride - sh.pad + j;
      if (x < 0 || x >= sh.width) continue;
      const std::size_t at = static_cast<std::size_t>(y * sh.width + x);
      if (!found || plane[at] > best) {
        best = plane[at];
        where = at;
        found = true;
      }
    }
  }
  return where;
}

}  // namespace

void max_pool2d_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x, float* y) {
  check(shape, "max_pool2d_forward");
  if (shape.batch == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_max_pool2d_forward(ctx, s, shape, x, y);
#endif
  detail::enqueue_cpu(ctx, s, [=] {
    const auto in_plane = static_cast<std::size_t>(shape.height) * static_cast<std::size_t>(shape.width);
    const long ph = shape.out_height();
    const long qw = shape.out_width();
    const auto planes = static_cast<std::size_t>(shape.batch) * static_cast<std::size_t>(shape.channels);
    detail::parallel_for(planes, 1, [&](std::size_t b, std::size_t e) {
      for (std::size_t pl = b; pl < e; ++pl) {
        const float* in = x + pl * in_plane;
        float* out = y + pl * static_cast<std::size_t>(ph * qw);
        for (long p = 0; p < ph; ++p)
          for (long q = 0; q < qw; ++q) out[p * qw + q] = in[argmax(shape, in, p, q)];
      }
    });
  });
}

void max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x,
                         const float* y, const float* dy, float* dx) {
  check(shape, "max_pool2d_backward");
  if (shape.batch == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_max_pool2d_backward(ctx, s, shape, x, y, dy, dx);
#endif
  (void)y;  // the cpu backend finds each window's maximum again from x
  detail::enqueue_cpu(ctx, s, [=] {
    const auto in_plane = static_cast<std::size_t>(shape.height) * static_cast<std::size_t>(shape.width);
    const long ph = shape.out_height();
    const long qw = shape.out_width();
    const auto planes = static_cast<std::size_t>(shape.batch) * static_cast<std::size_t>(shape.channels);
    detail::parallel_for(planes, 1, [&](std::size_t b, std::size_t e) {
      for (std::size_t pl = b; pl < e; ++pl) {
        const float* in = x + pl * in_plane;
        const float* g = dy + pl * static_cast<std::size_t>(ph * qw);
        float* out = dx + pl * in_plane;
        std::memset(out, 0, in_plane * sizeof(float));
        for (long p = 0; p < ph; ++p)
          for (long q = 0; q < qw; ++q) out[argmax(shape, in, p, q)] += g[p * qw + q];
      }
    });
  });
}

void global_avg_pool_forward(kernel_context& ctx, stream s, const float* x, float* y, int batch,
                             int channels, int plane) {
  SPILLWAY_KERNEL_EXPECTS(batch >= 0 && channels > 0 && plane > 0, "global_avg_pool_forward");
  if (batch == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_global_avg_pool_forward(ctx, s, x, y, batch, channels, plane);
#endif
  detail::enqueue_cpu(ctx, s, [=] {
    const auto n = static_cast<std::size_t>(plane);
    detail::parallel_for(static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels),
                         detail::grain_for(n), [&](std::size_t b, std::size_t e) {
      for (std::size_t pl = b; pl < e; ++pl) {
        float sum = 0.0f;
        for (std::size_t i = 0; i < n; ++i) sum += x[pl * n + i];
        y[pl] = sum / static_cast<float>(plane);
      }
    });
  });
}

void global_avg_pool_backward(kernel_context& ctx, stream s, const float* dy, float* dx, int batch,
                              int channels, int plane) {
  SPILLWAY_KERNEL_EXPECTS(batch >= 0 && channels > 0 && plane > 0, "global_avg_pool_backward");
  if (batch == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_global_avg_pool_backward(ctx, s, dy, dx, batch, channels, plane);
#endif
  detail::enqueue_cpu(ctx, s, [=] {
    const auto n = static_cast<std::size_t>(plane);
    detail::parallel_for(static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels),
                         detail::grain_for(n), [&](std::size_t b, std::size_t e) {
      for (std::size_t pl = b; pl < e; ++pl) {
        const float g = dy[pl] / static_cast<float>(plane);
        for (std::size_t i = 0; i < n; ++i) dx[pl * n + i] = g;
      }
    });
  });
}

}  // namespace spillway::kernels

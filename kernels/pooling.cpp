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
  SPILLWAY_KERNEL_EXPECTS(sh.batch >= 0 && sh.channels > 0 && sh.window.fits(sh.height) &&
                              sh.window.fits(sh.width) && sh.window.pad < sh.window.size,
                          kernel);
}

/// The cpu work of a pooling kernel: body(plane) for each of the `planes` planes (one image's
/// channel each), planes in parallel, each plane whole in one thread.
template <class F>
auto each_plane(std::size_t planes, std::size_t grain, F body) {
  return [=] {
    detail::parallel_for(planes, grain, [&](std::size_t b, std::size_t e) {
      for (std::size_t pl = b; pl < e; ++pl) body(pl);
    });
  };
}

std::size_t planes_of(int batch, int channels) {
  return static_cast<std::size_t>(batch) * static_cast<std::size_t>(channels);
}

/// A max pool's plane in floats (`in`) and its output's rows and columns.
struct pool_sizes {
  std::size_t in;
  long ph;
  long qw;
  [[nodiscard]] std::size_t out() const { return static_cast<std::size_t>(ph * qw); }
};

pool_sizes sizes_of(const pool2d_shape& sh) {
  return {static_cast<std::size_t>(sh.height) * static_cast<std::size_t>(sh.width), sh.out_height(), sh.out_width()};
}

/// Index in the plane of the maximum of window (p, q): the first in row-major window order.
std::size_t argmax(const pool2d_shape& sh, const float* plane, long p, long q) {
  const window2d& w = sh.window;
  float best = -std::numeric_limits<float>::infinity();
  std::size_t where = 0;
  bool found = false;
  for (long i = 0; i < w.size; ++i) {
    const long y = p * w.stride - w.pad + i;
    if (y < 0 || y >= sh.height) continue;
    for (long j = 0; j < w.size; ++j) {
      const long x = q * w.stride - w.pad + j;
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
  const pool_sizes z = sizes_of(shape);
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_max_pool2d_forward(ctx, s, shape, x, y),
                         each_plane(planes_of(shape.batch, shape.channels), 1, [=](std::size_t pl) {
                           const float* in = x + pl * z.in;
                           float* out = y + pl * z.out();
                           for (long p = 0; p < z.ph; ++p)
                             for (long q = 0; q < z.qw; ++q) out[p * z.qw + q] = in[argmax(shape, in, p, q)];
                         }));
}

void max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x,
                         const float* y, const float* dy, float* dx) {
  check(shape, "max_pool2d_backward");
  if (shape.batch == 0) return;
  (void)y;  // the cpu backend finds each window's maximum again from x
  const pool_sizes z = sizes_of(shape);
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_max_pool2d_backward(ctx, s, shape, x, y, dy, dx),
                         each_plane(planes_of(shape.batch, shape.channels), 1, [=](std::size_t pl) {
                           const float* in = x + pl * z.in;
                           const float* g = dy + pl * z.out();
                           float* out = dx + pl * z.in;
                           std::memset(out, 0, z.in * sizeof(float));
                           for (long p = 0; p < z.ph; ++p)
                             for (long q = 0; q < z.qw; ++q) out[argmax(shape, in, p, q)] += g[p * z.qw + q];
                         }));
}

namespace {

/// Both global average pool kernels: one check, one dispatch each way. forward: out[pl] = mean
/// of in's plane pl; backward: every element of out's plane pl = in[pl] / plane.
void avg_pool(kernel_context& ctx, stream s, bool backward, const float* in, float* out, int batch, int channels,
              int plane) {
  SPILLWAY_KERNEL_EXPECTS(batch >= 0 && channels > 0 && plane > 0,
                          backward ? "global_avg_pool_backward" : "global_avg_pool_forward");
  if (batch == 0) return;
  const auto n = static_cast<std::size_t>(plane);
  const std::size_t planes = planes_of(batch, channels);
  if (!backward)
    return SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_global_avg_pool_forward(ctx, s, in, out, batch, channels, plane),
                                  each_plane(planes, detail::grain_for(n), [=](std::size_t pl) {
                                    float sum = 0.0f;
                                    for (std::size_t i = 0; i < n; ++i) sum += in[pl * n + i];
                                    out[pl] = sum / static_cast<float>(plane);
                                  }));
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_global_avg_pool_backward(ctx, s, in, out, batch, channels, plane),
                         each_plane(planes, detail::grain_for(n), [=](std::size_t pl) {
                           const float g = in[pl] / static_cast<float>(plane);
                           for (std::size_t i = 0; i < n; ++i) out[pl * n + i] = g;
                         }));
}

}  // namespace

void global_avg_pool_forward(kernel_context& ctx, stream s, const float* x, float* y, int batch,
                             int channels, int plane) {
  avg_pool(ctx, s, false, x, y, batch, channels, plane);
}

void global_avg_pool_backward(kernel_context& ctx, stream s, const float* dy, float* dx, int batch,
                              int channels, int plane) {
  avg_pool(ctx, s, true, dy, dx, batch, channels, plane);
}

}  // namespace spillway::kernels

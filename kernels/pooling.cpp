// Dispatch and cpu launchers of max pooling and global average pooling: planes in parallel,
// each plane handled in a fixed order by one thread; one body per kernel for float32 and bf16.
#include "kernels/pooling.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"
#include "kernels/pool_window.hpp"

namespace spillway::kernels {
namespace {

/// "x [batch, channels, height, width], window 3 stride 2 pad 1": the shape as an error names it.
std::string describe(const pool2d_shape& sh) {
  return "x [" + std::to_string(sh.batch) + ", " + std::to_string(sh.channels) + ", " + std::to_string(sh.height) +
         ", " + std::to_string(sh.width) + "] (batch, channels, height, width), window " +
         std::to_string(sh.window.size) + " stride " + std::to_string(sh.window.stride) + " pad " +
         std::to_string(sh.window.pad);
}

/// Every extent checked before any work, on both backends: with no rows or columns (or a padding
/// as wide as the window) some window holds padding alone and has no maximum to take.
void check(const pool2d_shape& sh, const char* kernel) {
  const auto need = [&](bool ok, const char* what) {
    SPILLWAY_EXPECTS_T(usage_error, ok, std::string(kernel) + ": " + describe(sh) + ": " + what);
  };
  need(sh.batch >= 0, "the batch must not be negative");
  need(sh.channels > 0, "channels must be at least 1");
  need(sh.height > 0 && sh.width > 0, "height and width must be at least 1");
  need(sh.window.size > 0 && sh.window.stride > 0, "the window's size and stride must be at least 1");
  need(sh.window.pad >= 0 && sh.window.pad < sh.window.size,
       "the padding must be at least 0 and less than the window's size, so that every window holds a pixel");
  need(sh.window.fits(sh.height) && sh.window.fits(sh.width),
       "the window must fit the padded image (height + 2 pad and width + 2 pad at least the window's size)");
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

detail::pool_plane plane_of(const pool2d_shape& sh) {
  return {sh.height, sh.width, sh.out_height(), sh.out_width(), sh.window.size, sh.window.stride, sh.window.pad};
}

template <class T>
void max_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const T* x, T* y) {
  check(shape, "max_pool2d_forward");
  if (shape.batch == 0) return;
  const detail::pool_plane z = plane_of(shape);
  const auto in = static_cast<std::size_t>(z.height * z.width);
  const auto out = static_cast<std::size_t>(z.out_height * z.out_width);
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_max_pool2d_forward(ctx, s, shape, x, y),
                         each_plane(planes_of(shape.batch, shape.channels), 1, [=](std::size_t pl) {
                           const T* src = x + pl * in;
                           T* dst = y + pl * out;
                           for (long p = 0; p < z.out_height; ++p)
                             for (long q = 0; q < z.out_width; ++q)
                               dst[p * z.out_width + q] = src[detail::pool_argmax(z, src, p, q)];
                         }));
}

template <class T>
void max_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const T* x, const T* y, const T* dy,
                  T* dx) {
  check(shape, "max_pool2d_backward");
  if (shape.batch == 0) return;
  (void)y;  // both backends find each window's maximum again from x
  const detail::pool_plane z = plane_of(shape);
  const auto in = static_cast<std::size_t>(z.height * z.width);
  const auto out = static_cast<std::size_t>(z.out_height * z.out_width);
  // Each plane's sums in float32, walking the windows in row-major order, then stored once.
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_max_pool2d_backward(ctx, s, shape, x, y, dy, dx),
                         each_plane(planes_of(shape.batch, shape.channels), 1, [=](std::size_t pl) {
                           const T* src = x + pl * in;
                           const T* g = dy + pl * out;
                           std::vector<float> acc(in, 0.0f);
                           for (long p = 0; p < z.out_height; ++p)
                             for (long q = 0; q < z.out_width; ++q)
                               acc[static_cast<std::size_t>(detail::pool_argmax(z, src, p, q))] +=
                                   load(g[p * z.out_width + q]);
                           T* dst = dx + pl * in;
                           for (std::size_t i = 0; i < in; ++i) dst[i] = store_as<T>(acc[i]);
                         }));
}

/// Both global average pool kernels: one check, one dispatch each way. forward: out[pl] = mean
/// of in's plane pl; backward: every element of out's plane pl = in[pl] / plane.
template <class T>
void avg_pool(kernel_context& ctx, stream s, bool backward, const T* in, T* out, int batch, int channels,
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
                                    for (std::size_t i = 0; i < n; ++i) sum += load(in[pl * n + i]);
                                    out[pl] = store_as<T>(sum / static_cast<float>(plane));
                                  }));
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_global_avg_pool_backward(ctx, s, in, out, batch, channels, plane),
                         each_plane(planes, detail::grain_for(n), [=](std::size_t pl) {
                           const T g = store_as<T>(load(in[pl]) / static_cast<float>(plane));
                           for (std::size_t i = 0; i < n; ++i) out[pl * n + i] = g;
                         }));
}

}  // namespace

void max_pool2d_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x, float* y) {
  max_forward(ctx, s, shape, x, y);
}

void max_pool2d_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const bf16* x, bf16* y) {
  max_forward(ctx, s, shape, x, y);
}

void max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x,
                         const float* y, const float* dy, float* dx) {
  max_backward(ctx, s, shape, x, y, dy, dx);
}

void max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const bf16* x, const bf16* y,
                         const bf16* dy, bf16* dx) {
  max_backward(ctx, s, shape, x, y, dy, dx);
}

void global_avg_pool_forward(kernel_context& ctx, stream s, const float* x, float* y, int batch,
                             int channels, int plane) {
  avg_pool(ctx, s, false, x, y, batch, channels, plane);
}

void global_avg_pool_forward(kernel_context& ctx, stream s, const bf16* x, bf16* y, int batch, int channels,
                             int plane) {
  avg_pool(ctx, s, false, x, y, batch, channels, plane);
}

void global_avg_pool_backward(kernel_context& ctx, stream s, const float* dy, float* dx, int batch,
                              int channels, int plane) {
  avg_pool(ctx, s, true, dy, dx, batch, channels, plane);
}

void global_avg_pool_backward(kernel_context& ctx, stream s, const bf16* dy, bf16* dx, int batch, int channels,
                              int plane) {
  avg_pool(ctx, s, true, dy, dx, batch, channels, plane);
}

}  // namespace spillway::kernels

// Pooling on NCHW images, float32 or bf16: max pooling and global average pooling (the head of
// a ResNet), forward and backward.
#pragma once

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"
#include "kernels/window2d.hpp"

namespace spillway::kernels {

/// x [batch, channels, height, width] -> y [batch, channels, out_height(), out_width()]:
/// pool2d_shape{batch, channels, h, w, {size, stride, pad}}. Padding never wins a max.
struct pool2d_shape {
  int batch = 0, channels = 0, height = 0, width = 0;  ///< x's dimensions
  window2d window{2, 2, 0};

  [[nodiscard]] int out_height() const noexcept { return window.out(height); }
  [[nodiscard]] int out_width() const noexcept { return window.out(width); }
};

void max_pool2d_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x, float* y);

/// dx (overwritten) gets each dy at the position of its window's maximum (the first one in
/// row-major window order on ties); where windows overlap, an element sums its windows' dy in
/// row-major window order, in float32, on both backends. Needs the forward's x (y is unused).
void max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x,
                         const float* y, const float* dy, float* dx);

/// y[n, c] = mean over the plane of x[n, c, :, :]; plane = height * width.
void global_avg_pool_forward(kernel_context& ctx, stream s, const float* x, float* y, int batch,
                             int channels, int plane);

/// dx[n, c, i] = dy[n, c] / plane (overwritten).
void global_avg_pool_backward(kernel_context& ctx, stream s, const float* dy, float* dx, int batch,
                              int channels, int plane);

/// bf16 images and gradients: the same arithmetic in float32 (a maximum is copied bit for bit,
/// sums are narrowed once), so every output is to_bf16 of the float32 kernel's on the widened
/// inputs.
void max_pool2d_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const bf16* x, bf16* y);
void max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const bf16* x, const bf16* y,
                         const bf16* dy, bf16* dx);
void global_avg_pool_forward(kernel_context& ctx, stream s, const bf16* x, bf16* y, int batch, int channels,
                             int plane);
void global_avg_pool_backward(kernel_context& ctx, stream s, const bf16* dy, bf16* dx, int batch, int channels,
                              int plane);

}  // namespace spillway::kernels

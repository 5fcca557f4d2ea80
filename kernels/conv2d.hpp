// 2-D convolution on NCHW float32 images (cross-correlation, as every framework computes it),
// forward and backward: cuDNN on the cuda backend, im2col + OpenBLAS on the cpu backend.
#pragma once

#include <cstddef>

#include "kernels/context.hpp"
#include "kernels/window2d.hpp"

namespace spillway::kernels {

/// x [batch, in_channels, height, width], w [out_channels, in_channels, kernel.size, kernel.size],
/// y [batch, out_channels, out_height(), out_width()], bias [out_channels]. Square kernels, one
/// stride and one zero padding for both axes: conv2d_shape{batch, in, h, w, out, {size, stride, pad}}.
struct conv2d_shape {
  int batch = 0, in_channels = 0, height = 0, width = 0;  ///< x's dimensions
  int out_channels = 0;
  window2d kernel{};

  [[nodiscard]] int out_height() const noexcept { return kernel.out(height); }
  [[nodiscard]] int out_width() const noexcept { return kernel.out(width); }
};

/// Workspace the convolution of `shape` needs, forward and backward, on ctx's backend: cuDNN's
/// algorithms' scratch on the cuda backend, 0 on the cpu backend (its im2col columns are the
/// kernel's own memory). Bind at least this much around conv2d_forward and conv2d_backward
/// (Note [Workspace]).
[[nodiscard]] std::size_t conv2d_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape);

/// y = conv(x, w) (+ bias per output channel when bias != nullptr).
void conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                    const float* w, const float* bias, float* y);

/// dx (overwritten; skipped when nullptr), dw and dbias (skipped when nullptr) overwritten or,
/// with accumulate, added to. Reductions over the batch run image by image, in order.
void conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                     const float* w, const float* dy, float* dx, float* dw, float* dbias,
                     bool accumulate);

}  // namespace spillway::kernels

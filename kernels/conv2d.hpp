// 2-D convolution on NCHW float32 or bf16 images (cross-correlation, as every framework computes
// it), forward and backward: cuDNN on the cuda backend, im2col + OpenBLAS on the cpu backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.hpp"
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

/// The most elements x or y of one convolution may have (cuDNN counts them in an int); a larger
/// shape is refused on every backend, so a batch that runs on the cpu backend runs on a GPU.
inline constexpr std::uint64_t conv2d_max_elements = 2147483647;

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

/// Workspace the bf16 conv2d_forward and conv2d_backward of `shape` need bound on ctx's backend:
/// cuDNN's scratch for its bf16 algorithms on the cuda backend; on the cpu backend the float32
/// copies the launchers widen into and narrow from (w and dw whole, one image of y or dy, one
/// image of dx), since OpenBLAS multiplies float32 only (Note [Workspace]).
[[nodiscard]] std::size_t conv2d_bf16_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape);

/// bf16 x, w, bias, y, dy, dx, dw and dbias, products summed in float32. cpu backend: the
/// float32 kernel's arithmetic on the widened values, each output narrowed once (bias added
/// before), so every output is to_bf16 of the float32 kernel's. cuda backend: cuDNN with bf16
/// data and float32 compute, then the bias added to the bf16 y (a second rounding).
void conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const bf16* x, const bf16* w,
                    const bf16* bias, bf16* y);
void conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const bf16* x, const bf16* w,
                     const bf16* dy, bf16* dx, bf16* dw, bf16* dbias, bool accumulate);

}  // namespace spillway::kernels

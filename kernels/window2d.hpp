// window2d: a square window sliding over both axes of an NCHW image with one stride and one
// zero padding, the part convolution and pooling share (their shapes hold one).
#pragma once

namespace spillway::kernels {

/// Window `size` x `size`, moved by `stride` along each axis over an image padded by `pad`.
struct window2d {
  int size = 1;
  int stride = 1;
  int pad = 0;

  /// Positions the window takes along an axis of `extent` pixels (the output's extent).
  [[nodiscard]] int out(int extent) const noexcept { return (extent + 2 * pad - size) / stride + 1; }
  /// Whether the arguments make sense for an axis of `extent` pixels: at least one pixel, a
  /// window and a stride of at least 1, no negative padding, and room in the padded axis for at
  /// least one window (counted in 64 bits, so no sum overflows).
  [[nodiscard]] bool fits(int extent) const noexcept {
    return extent > 0 && size > 0 && stride > 0 && pad >= 0 &&
           static_cast<long long>(extent) + 2LL * pad >= size &&
           static_cast<long long>(extent) + 2LL * pad <= 2147483647LL;
  }
};

}  // namespace spillway::kernels

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
  /// Whether the arguments make sense and the padded axis of `extent` holds at least one window.
  [[nodiscard]] bool fits(int extent) const noexcept {
    return size > 0 && stride > 0 && pad >= 0 && extent + 2 * pad >= size;
  }
};

}  // namespace spillway::kernels

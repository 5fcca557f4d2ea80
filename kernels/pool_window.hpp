// The window search max pooling shares between its cpu and cuda launchers: which element of a
// plane is the maximum of a window, and which windows cover an element. SPILLWAY_HD bodies, so
// both backends pick the same element and add a pixel's gradients in the same order.
#pragma once

#include "kernels/bf16.hpp"
#include "kernels/hd.hpp"

namespace spillway::kernels::detail {

/// A max pool's plane (height x width) and window, as plain numbers both compilers take.
struct pool_plane {
  long height, width;  ///< the input plane
  long out_height, out_width;
  long size, stride, pad;
};

/// Index in `plane` of the maximum of window (p, q): the first in row-major window order that
/// no later element beats (padding never wins).
template <class T>
SPILLWAY_HD inline long pool_argmax(const pool_plane& z, const T* plane, long p, long q) {
  float best = 0.0f;
  long where = -1;
  for (long i = 0; i < z.size; ++i) {
    const long y = p * z.stride - z.pad + i;
    if (y < 0 || y >= z.height) continue;
    for (long j = 0; j < z.size; ++j) {
      const long x = q * z.stride - z.pad + j;
      if (x < 0 || x >= z.width) continue;
      const long at = y * z.width + x;
      const float v = load(plane[at]);
      if (where < 0 || v > best) {
        best = v;
        where = at;
      }
    }
  }
  return where;
}

/// The window positions whose window covers coordinate c of an axis with `out` positions:
/// [*first, *last] (empty when *first > *last).
SPILLWAY_HD inline void covering(long c, long out, long size, long stride, long pad, long* first, long* last) {
  // Window p spans [p * stride - pad, p * stride - pad + size - 1] of the axis.
  const long last_start = (c + pad) / stride;  // the last window starting at or before c
  const long reach = c + pad - size + 1;       // window p reaches c when p * stride >= reach
  *first = reach <= 0 ? 0 : (reach + stride - 1) / stride;
  *last = last_start < out - 1 ? last_start : out - 1;
}

/// dx of element (y, x) of a plane: the sum, in row-major window order, of dy over the windows
/// whose maximum it is. Used by the cuda launcher; the cpu one adds the same terms in the same
/// order by walking the windows.
template <class T>
SPILLWAY_HD inline float pool_gather_grad(const pool_plane& z, const T* plane, const T* dy, long y, long x) {
  long p0, p1, q0, q1;
  covering(y, z.out_height, z.size, z.stride, z.pad, &p0, &p1);
  covering(x, z.out_width, z.size, z.stride, z.pad, &q0, &q1);
  const long me = y * z.width + x;
  float acc = 0.0f;
  for (long p = p0; p <= p1; ++p)
    for (long q = q0; q <= q1; ++q)
      if (pool_argmax(z, plane, p, q) == me) acc += load(dy[p * z.out_width + q]);
  return acc;
}

}  // namespace spillway::kernels::detail

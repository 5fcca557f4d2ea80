// comm/: the summing loop of every reduction over ranks, rank 0 first, element by element.
// Blocked so that the vectoriser works along the elements (never across ranks).
#include "comm/fixed_order_sum.hpp"

#include <cfloat>
#include <cstring>

#if defined(__FAST_MATH__)
#error "comm/ must not be compiled with -ffast-math: Note [Fixed-order reductions] needs IEEE sums"
#endif
#if FLT_EVAL_METHOD != 0
#error "comm/ needs float sums taken in float (FLT_EVAL_METHOD 0)"
#endif

namespace spillway::comm::detail {

void fixed_order_sum(const float* const* src, int ranks, float* out, std::size_t n) noexcept {
  constexpr std::size_t block = 1024;
  float acc[block];
  for (std::size_t b = 0; b < n; b += block) {
    const std::size_t len = n - b < block ? n - b : block;
    const float* x0 = src[0] + b;
    for (std::size_t i = 0; i < len; ++i) acc[i] = x0[i];  // s = x_0
    for (int r = 1; r < ranks; ++r) {                      // s += x_r, r = 1 .. N-1 in order
      const float* xr = src[r] + b;
      for (std::size_t i = 0; i < len; ++i) acc[i] += xr[i];
    }
    std::memcpy(out + b, acc, len * sizeof(float));
  }
}

}  // namespace spillway::comm::detail

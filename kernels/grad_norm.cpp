// Dispatch and cpu launchers of the global-norm pair: the sum of squares in the fixed chunk and
// lane order of Note [Sum of squares order], and the clip that scales a buffer in place.
#include "kernels/grad_norm.hpp"

#include <array>
#include <cmath>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

constexpr std::size_t lanes = sum_of_squares_lanes;
static_assert((lanes & (lanes - 1)) == 0, "the summation tree halves the lanes");
static_assert(sum_of_squares_chunk % lanes == 0, "a chunk is whole rounds of the lanes");

/// The halving tree over the lanes: lane t += lane t + half, for half = lanes/2 down to 1.
float tree_sum(std::array<float, lanes>& lane) {
  for (std::size_t half = lanes / 2; half > 0; half /= 2)
    for (std::size_t t = 0; t < half; ++t) lane[t] = exact::add(lane[t], lane[t + half]);
  return lane[0];
}

/// Lane t adds v(i) for i = t, t + lanes, ... below n, in order; then the tree.
template <class V>
float lane_sum(std::size_t n, const V& v) {
  std::array<float, lanes> lane{};
  for (std::size_t round = 0; round < n; round += lanes) {
    const std::size_t m = n - round < lanes ? n - round : lanes;
    for (std::size_t t = 0; t < m; ++t) lane[t] = exact::add(lane[t], v(round + t));
  }
  return tree_sum(lane);
}

constexpr std::size_t clip_grain = 1u << 14;

}  // namespace

namespace {

template <class T>
void sum_of_squares_any(kernel_context& ctx, stream s, const T* x, std::size_t n, float* sum_sq, bool accumulate) {
  SPILLWAY_KERNEL_EXPECTS(sum_sq != nullptr, "sum_of_squares");
  SPILLWAY_KERNEL_EXPECTS(n == 0 || x != nullptr, "sum_of_squares");
  // The partial sums go to the bound workspace (Note [Workspace]), taken here at the launch so
  // that a missing one is an error of the call, not of the stream; the same on both backends.
  const std::size_t need = sum_of_squares_workspace_bytes(n);
  auto* partial = need == 0 ? nullptr : static_cast<float*>(ctx.workspace(need, "sum_of_squares"));
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_sum_of_squares(ctx, s, x, n, sum_sq, accumulate), [=] {
    const std::size_t chunks = (n + sum_of_squares_chunk - 1) / sum_of_squares_chunk;
    // Each chunk writes only its own result, so the split over threads changes nothing.
    detail::parallel_for(chunks, 16, [&](std::size_t b, std::size_t e) {
      for (std::size_t c = b; c < e; ++c) {
        const T* chunk = x + c * sum_of_squares_chunk;
        const std::size_t m = n - c * sum_of_squares_chunk < sum_of_squares_chunk ? n - c * sum_of_squares_chunk
                                                                                  : sum_of_squares_chunk;
        partial[c] = lane_sum(m, [&](std::size_t i) {
          const float v = load(chunk[i]);
          return exact::mul(v, v);
        });
      }
    });
    const float total = lane_sum(chunks, [&](std::size_t c) { return partial[c]; });
    *sum_sq = accumulate ? exact::add(*sum_sq, total) : total;
  });
}

template <class T>
void clip_by_norm_any(kernel_context& ctx, stream s, T* g, std::size_t n, const float* sum_sq, float max_norm) {
  SPILLWAY_KERNEL_EXPECTS(max_norm > 0.0f && std::isfinite(max_norm), "clip_by_norm");
  SPILLWAY_KERNEL_EXPECTS(sum_sq != nullptr, "clip_by_norm");
  if (n == 0) return;
  SPILLWAY_KERNEL_EXPECTS(g != nullptr, "clip_by_norm");
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_clip_by_norm(ctx, s, g, n, sum_sq, max_norm), [=] {
    const float f = clip_factor(*sum_sq, max_norm);
    if (!(f < 1.0f)) return;  // within the norm: the gradients keep their bits
    detail::parallel_for(n, clip_grain, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) g[i] = store_as<T>(exact::mul(load(g[i]), f));
    });
  });
}

}  // namespace

void sum_of_squares(kernel_context& ctx, stream s, const float* x, std::size_t n, float* sum_sq, bool accumulate) {
  sum_of_squares_any(ctx, s, x, n, sum_sq, accumulate);
}
void sum_of_squares(kernel_context& ctx, stream s, const bf16* x, std::size_t n, float* sum_sq, bool accumulate) {
  sum_of_squares_any(ctx, s, x, n, sum_sq, accumulate);
}
void clip_by_norm(kernel_context& ctx, stream s, float* g, std::size_t n, const float* sum_sq, float max_norm) {
  clip_by_norm_any(ctx, s, g, n, sum_sq, max_norm);
}
void clip_by_norm(kernel_context& ctx, stream s, bf16* g, std::size_t n, const float* sum_sq, float max_norm) {
  clip_by_norm_any(ctx, s, g, n, sum_sq, max_norm);
}

}  // namespace spillway::kernels

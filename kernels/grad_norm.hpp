// Global-norm gradient clipping: the sum of squares of a buffer added into one float in device
// memory in a fixed order, and the in-place scale by min(1, max_norm / (norm + 1e-6)).
#pragma once

#include <cstddef>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"
#include "kernels/exact_math.hpp"
#include "kernels/hd.hpp"

namespace spillway::kernels {

// Note [Sum of squares order]
// The norm of all gradients must come out the same, bit for bit, on every run (Invariant 1:
// clipping scales every gradient by it, so any wobble reaches the losses). Both backends sum in
// one fixed shape, set by the constants below and nothing else (not the thread count, not the
// buffer's address):
//  * the buffer is cut into chunks of sum_of_squares_chunk elements; in a chunk, lane t
//    (t < sum_of_squares_lanes) adds x[i]^2 for i = t, t + lanes, ... in that order, and the
//    lanes are combined by a halving tree (lane t += lane t + half, half = lanes/2 ... 1);
//    the chunk's result goes to the workspace, one float per chunk;
//  * a second pass folds the chunk results the same way (lane t adds results t, t + lanes, ...,
//    then the tree) and adds the total to the destination float (or sets it).
// On the cuda backend a chunk is one block of sum_of_squares_lanes threads and the tree is in
// shared memory; on the cpu backend the same lanes are an array, and chunks run in parallel
// (each chunk's result is its own). No float atomics anywhere. Every square and every add is
// rounded on its own (Note [Exact math] in kernels/exact_math.hpp), so the two backends give
// the same bits too.

/// Elements per chunk of the first pass (one cuda block; one cpu task at most).
inline constexpr std::size_t sum_of_squares_chunk = 4096;
/// Lanes of the fixed summation tree (the cuda block size). A power of two.
inline constexpr std::size_t sum_of_squares_lanes = 256;

/// Workspace sum_of_squares needs for n elements, on both backends (Note [Workspace]): one float
/// per chunk, rounded up to 256 bytes; 0 when n is 0.
[[nodiscard]] constexpr std::size_t sum_of_squares_workspace_bytes(std::size_t n) noexcept {
  const std::size_t chunks = (n + sum_of_squares_chunk - 1) / sum_of_squares_chunk;
  return (chunks * sizeof(float) + 255) / 256 * 256;
}

/// *sum_sq = (accumulate ? *sum_sq : 0) + sum of x[i]^2 over i < n, in float32 in the fixed
/// order of Note [Sum of squares order]. sum_sq is one float in device memory, read and written
/// on the stream (no host round trip). Over several buffers (all the gradients of a model), call
/// it once per buffer in a fixed order, the first with accumulate = false. The partial sums go
/// to the bound workspace, which must hold sum_of_squares_workspace_bytes(n). n may be 0 (adds
/// nothing). x must not overlap the workspace or sum_sq.
void sum_of_squares(kernel_context& ctx, stream s, const float* x, std::size_t n, float* sum_sq, bool accumulate);
/// The same over bf16 values, each widened exactly before it is squared (the sum stays float32).
void sum_of_squares(kernel_context& ctx, stream s, const bf16* x, std::size_t n, float* sum_sq, bool accumulate);

/// The factor clipping scales gradients by: min(1, max_norm / (sqrt(sum_sq) + 1e-6)). A
/// sum_sq of NaN gives 1 (the gradients, which hold the NaN, are left as they are); +inf gives 0.
/// Correctly rounded steps, the same bits on both backends (Note [Exact math]).
SPILLWAY_HD inline float clip_factor(float sum_sq, float max_norm) {
  const float f = exact::div(max_norm, exact::add(exact::sqrt(sum_sq), 1e-6f));
  return f < 1.0f ? f : 1.0f;
}

/// g[i] *= clip_factor(*sum_sq, max_norm) for i < n, in place, reading *sum_sq (one float in
/// device memory, as sum_of_squares left it) on the stream. When the factor is 1 (the norm is
/// within max_norm) g is not written, so it keeps its bits. max_norm must be positive and finite.
void clip_by_norm(kernel_context& ctx, stream s, float* g, std::size_t n, const float* sum_sq, float max_norm);
/// The same on bf16 gradients: each widened, scaled in float32 and rounded back (to_bf16).
void clip_by_norm(kernel_context& ctx, stream s, bf16* g, std::size_t n, const float* sum_sq, float max_norm);

}  // namespace spillway::kernels

// The cuda backend's global-norm pair: the sum of squares as one block per chunk (a fixed
// shared-memory tree) and one block folding the chunk results (Note [Sum of squares order]),
// and the clip as a grid-stride scale that reads the sum from device memory. The same steps in
// the same order as the cpu launchers, each rounded on its own, so the bits match theirs.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/grad_norm.hpp"

namespace spillway::kernels::detail {
namespace {

static_assert(sum_of_squares_lanes == threads_per_block, "a chunk is one block of the tree's lanes");

/// Block c: lane t adds x[i]^2 for i = c * chunk + t, + lanes, ... inside the chunk; the tree;
/// the chunk's result to partial[c].
template <class T>
__global__ void sum_of_squares_kernel(const T* x, std::size_t n, float* partial) {
  __shared__ float shm[sum_of_squares_lanes];
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * sum_of_squares_chunk;
  const std::size_t end = n - first < sum_of_squares_chunk ? n : first + sum_of_squares_chunk;
  float acc = 0.0f;
  for (std::size_t i = first + threadIdx.x; i < end; i += sum_of_squares_lanes) {
    const float v = load(x[i]);
    acc = exact::add(acc, exact::mul(v, v));
  }
  acc = block_sum(acc, shm);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/// One block: lane t adds partial[c] for c = t, t + lanes, ...; the tree; into *sum_sq.
__global__ void sum_of_squares_fold_kernel(const float* partial, std::size_t chunks, float* sum_sq, bool accumulate) {
  __shared__ float shm[sum_of_squares_lanes];
  float acc = 0.0f;
  for (std::size_t c = threadIdx.x; c < chunks; c += sum_of_squares_lanes) acc += partial[c];
  acc = block_sum(acc, shm);
  if (threadIdx.x == 0) *sum_sq = accumulate ? exact::add(*sum_sq, acc) : acc;
}

template <class T>
__global__ void clip_by_norm_kernel(T* g, std::size_t n, const float* sum_sq, float max_norm) {
  const float f = clip_factor(*sum_sq, max_norm);
  if (!(f < 1.0f)) return;  // within the norm: the gradients keep their bits
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x)
    g[i] = store_as<T>(exact::mul(load(g[i]), f));
}

}  // namespace

template <class T>
void cuda_sum_of_squares(kernel_context& ctx, stream s, const T* x, std::size_t n, float* sum_sq, bool accumulate) {
  const std::size_t chunks = (n + sum_of_squares_chunk - 1) / sum_of_squares_chunk;
  SPILLWAY_EXPECTS_T(usage_error, chunks < (std::size_t{1} << 31),
                     "sum_of_squares: " + std::to_string(n) +
                         " elements are more chunks than a grid holds; give at most " +
                         std::to_string(((std::size_t{1} << 31) - 1) * sum_of_squares_chunk));
  float* partial = nullptr;
  if (chunks > 0) {
    partial = static_cast<float*>(ctx.workspace(sum_of_squares_workspace_bytes(n), "sum_of_squares"));
    SPILLWAY_CUDA_LAUNCH("sum_of_squares_kernel",
                         sum_of_squares_kernel<<<static_cast<unsigned>(chunks), sum_of_squares_lanes, 0, native(s)>>>(
                             x, n, partial));
  }
  SPILLWAY_CUDA_LAUNCH("sum_of_squares_fold_kernel",
                       sum_of_squares_fold_kernel<<<1, sum_of_squares_lanes, 0, native(s)>>>(
                           partial, chunks, sum_sq, accumulate));
}

template <class T>
void cuda_clip_by_norm(kernel_context&, stream s, T* g, std::size_t n, const float* sum_sq, float max_norm) {
  SPILLWAY_CUDA_LAUNCH("clip_by_norm_kernel",
                       clip_by_norm_kernel<<<blocks_for(n), threads_per_block, 0, native(s)>>>(g, n, sum_sq, max_norm));
}

template void cuda_sum_of_squares<float>(kernel_context&, stream, const float*, std::size_t, float*, bool);
template void cuda_sum_of_squares<bf16>(kernel_context&, stream, const bf16*, std::size_t, float*, bool);
template void cuda_clip_by_norm<float>(kernel_context&, stream, float*, std::size_t, const float*, float);
template void cuda_clip_by_norm<bf16>(kernel_context&, stream, bf16*, std::size_t, const float*, float);

}  // namespace spillway::kernels::detail

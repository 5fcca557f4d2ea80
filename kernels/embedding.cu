// The cuda backend's embedding: a gather per output element; backward as one thread per table
// column walking the tokens in order (no atomics, so the sums are the same bits every run).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"

namespace spillway::kernels::detail {
namespace {

struct gather_f {
  const std::int32_t* ids;
  const float* table;
  float* out;
  std::size_t dim;
  int vocab;
  bool accumulate;
  __device__ void operator()(std::size_t i) const {
    const std::int32_t id = ids[i / dim];
    const float v = (id >= 0 && id < vocab) ? table[static_cast<std::size_t>(id) * dim + i % dim] : 0.0f;
    out[i] = accumulate ? out[i] + v : v;
  }
};

__global__ void scatter_add_kernel(const std::int32_t* ids, const float* dout, float* dtable, int tokens,
                                   int vocab, int dim) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  for (int t = 0; t < tokens; ++t) {
    const std::int32_t id = ids[t];
    if (id < 0 || id >= vocab) continue;
    dtable[static_cast<std::size_t>(id) * dim + j] += dout[static_cast<std::size_t>(t) * dim + j];
  }
}

}  // namespace

void cuda_embedding_forward(kernel_context&, stream s, const std::int32_t* ids, const float* table, float* out,
                            int tokens, int vocab, int dim, bool accumulate) {
  const std::size_t n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dim);
  SPILLWAY_CUDA_MAP("embedding_gather", s, n,
                    (gather_f{ids, table, out, static_cast<std::size_t>(dim), vocab, accumulate}));
}

void cuda_embedding_backward(kernel_context&, stream s, const std::int32_t* ids, const float* dout, float* dtable,
                             int tokens, int vocab, int dim, bool accumulate) {
  if (!accumulate)
    SPILLWAY_CUDA_TRY(cudaMemsetAsync(dtable, 0, sizeof(float) * static_cast<std::size_t>(vocab) * dim, native(s)));
  if (tokens == 0) return;
  SPILLWAY_CUDA_LAUNCH("scatter_add_kernel",
                       scatter_add_kernel<<<blocks_for(static_cast<std::size_t>(dim), 64), 64, 0, native(s)>>>(
                           ids, dout, dtable, tokens, vocab, dim));
}

}  // namespace spillway::kernels::detail

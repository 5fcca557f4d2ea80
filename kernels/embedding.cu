// The cuda backend's embedding, templates over the storage type T (float or bf16): a gather per
// output element; backward as one block per (table row, 256 columns) that finds the row's tokens
// in token order (a warp vote per 32 tokens) and sums them in float32 in that order, storing
// each element once: no atomics, so the sums are the same bits every run and match the cpu's.
// Both then report the first id outside the vocabulary (Note [Reports from kernels]).
#include "kernels/bf16.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"

namespace spillway::kernels::detail {
namespace {

template <class T>
struct gather_f {
  const std::int32_t* ids;
  const T* table;
  T* out;
  std::size_t dim;
  int vocab;
  bool accumulate;
  __device__ void operator()(std::size_t i) const {
    const std::int32_t id = ids[i / dim];
    // An id outside the vocabulary is reported after this kernel (an error at synchronize, as on
    // the cpu); here its row reads as zeros, so nothing reads outside the table.
    const float v = (id >= 0 && id < vocab) ? load(table[static_cast<std::size_t>(id) * dim + i % dim]) : 0.0f;
    out[i] = store_as<T>(accumulate ? load(out[i]) + v : v);
  }
};

/// Block (row, column group): thread x owns column blockIdx.y * blockDim.x + x of table row
/// blockIdx.x. The block walks the tokens in chunks of blockDim.x; each warp votes which of its
/// 32 tokens have this row's id, and every thread then adds those tokens' gradients in token
/// order. blockDim.x is a multiple of 32 and every thread takes part in every vote.
template <class T>
__global__ void scatter_add_kernel(const std::int32_t* ids, const T* dout, T* dtable, int tokens, int dim,
                                   bool accumulate) {
  __shared__ unsigned votes[threads_per_block / 32];
  const int row = blockIdx.x;
  const int j = blockIdx.y * blockDim.x + threadIdx.x;
  const bool mine = j < dim;
  const std::size_t at = static_cast<std::size_t>(row) * dim + j;
  float acc = (accumulate && mine) ? load(dtable[at]) : 0.0f;
  const unsigned warps = blockDim.x / 32;
  for (int t0 = 0; t0 < tokens; t0 += blockDim.x) {
    const int t = t0 + static_cast<int>(threadIdx.x);
    const unsigned vote = __ballot_sync(0xffffffffu, t < tokens && ids[t] == row);
    if (threadIdx.x % 32 == 0) votes[threadIdx.x / 32] = vote;
    __syncthreads();
    for (unsigned w = 0; w < warps; ++w)
      for (unsigned bits = votes[w]; bits != 0; bits &= bits - 1) {
        const int tok = t0 + static_cast<int>(w * 32 + __ffs(bits) - 1);
        if (mine) acc += load(dout[static_cast<std::size_t>(tok) * dim + j]);
      }
    __syncthreads();  // the votes are read before the next chunk overwrites them
  }
  if (mine) dtable[at] = store_as<T>(acc);
}

}  // namespace

template <class T>
void cuda_embedding_forward(kernel_context&, stream s, const std::int32_t* ids, const T* table, T* out, int tokens,
                            int vocab, int dim, bool accumulate, std::int32_t* report) {
  const std::size_t n = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(dim);
  SPILLWAY_CUDA_MAP("embedding_gather", s, n,
                    (gather_f<T>{ids, table, out, static_cast<std::size_t>(dim), vocab, accumulate}));
  cuda_report_first_outside(s, ids, tokens, 0, vocab, report);  // last (cuda_launchers.hpp)
}

template <class T>
void cuda_embedding_backward(kernel_context&, stream s, const std::int32_t* ids, const T* dout, T* dtable,
                             int tokens, int vocab, int dim, bool accumulate, std::int32_t* report) {
  // A token whose id is outside the vocabulary matches no row, so its gradient goes nowhere; the
  // report after the scatter names it.
  if (tokens > 0 || !accumulate) {
    const dim3 grid(static_cast<unsigned>(vocab),
                    (static_cast<unsigned>(dim) + threads_per_block - 1) / threads_per_block);
    SPILLWAY_CUDA_LAUNCH("scatter_add_kernel",
                         scatter_add_kernel<T><<<grid, threads_per_block, 0, native(s)>>>(
                             ids, dout, dtable, tokens, dim, accumulate));
  }
  cuda_report_first_outside(s, ids, tokens, 0, vocab, report);  // last (cuda_launchers.hpp)
}

#define SPILLWAY_EMBEDDING_LAUNCHERS(T)                                                                        \
  template void cuda_embedding_forward<T>(kernel_context&, stream, const std::int32_t*, const T*, T*, int, int, \
                                          int, bool, std::int32_t*);                                           \
  template void cuda_embedding_backward<T>(kernel_context&, stream, const std::int32_t*, const T*, T*, int, int, \
                                           int, bool, std::int32_t*);
SPILLWAY_EMBEDDING_LAUNCHERS(float)
SPILLWAY_EMBEDDING_LAUNCHERS(bf16)
#undef SPILLWAY_EMBEDDING_LAUNCHERS

}  // namespace spillway::kernels::detail

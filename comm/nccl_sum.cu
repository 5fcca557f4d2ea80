// comm/: the rank-order sum on the device (Note [Fixed-order reductions]). __fadd_rn is never
// contracted or reassociated, and the build adds --fmad=false besides.
#include "comm/nccl_sum.hpp"

#include <algorithm>

#include "device/cuda_check.hpp"

namespace spillway::comm::detail {

namespace {
__global__ void fixed_order_sum_kernel(const float* staging, const float* own, int rank, int ranks,
                                       float* out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float s = rank == 0 ? own[i] : staging[i];
    for (int r = 1; r < ranks; ++r)
      s = __fadd_rn(s, r == rank ? own[i] : staging[static_cast<std::size_t>(r) * n + i]);
    out[i] = s;
  }
}
}  // namespace

void launch_fixed_order_sum(const float* staging, const float* own, int rank, int ranks,
                            float* out, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr unsigned threads = 256;
  const auto blocks = static_cast<unsigned>(std::min<std::size_t>((n + threads - 1) / threads, 4096));
  // The thread's last-error slot may still hold an earlier error a caller tolerated: cleared
  // first, so the check after the launch reports this launch's own (a sticky error survives the
  // clearing read and fails the launch itself).
  (void)cudaGetLastError();
  fixed_order_sum_kernel<<<blocks, threads, 0, stream>>>(staging, own, rank, ranks, out, n);
  SPILLWAY_CUDA_TRY(cudaGetLastError());
}

}  // namespace spillway::comm::detail

// The one-block kernel behind the cuda backend's reports of an index outside its range (a class
// target, a token id): it finds the first such value for the host function that throws the cpu
// launcher's error for it (Note [Reports from kernels] in kernels/context.hpp).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"

namespace spillway::kernels::detail {
namespace {

/// One block: report[0] = the least i < n with values[i] outside [lo, hi), or -1; report[1] = that
/// value (0 when none). report is pinned host memory mapped for the GPU.
__global__ void first_outside_kernel(const std::int32_t* values, int n, std::int32_t lo, std::int32_t hi,
                                     std::int32_t* report) {
  __shared__ int shm[threads_per_block];
  int first = n;  // none
  for (long long i = threadIdx.x; i < n; i += blockDim.x)
    if (values[i] < lo || values[i] >= hi) {
      first = static_cast<int>(i);  // each thread walks its indices upward: its first hit is its least
      break;
    }
  shm[threadIdx.x] = first;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shm[threadIdx.x] = min(shm[threadIdx.x], shm[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int at = shm[0];
    report[0] = at < n ? at : -1;
    report[1] = at < n ? values[at] : 0;
    __threadfence_system();  // the host function after this kernel reads both
  }
}

}  // namespace

void cuda_report_first_outside(stream s, const std::int32_t* values, int n, std::int32_t lo, std::int32_t hi,
                               std::int32_t* report) {
  SPILLWAY_CUDA_LAUNCH("first_outside_kernel",
                       first_outside_kernel<<<1, threads_per_block, 0, native(s)>>>(values, n, lo, hi, report));
}

}  // namespace spillway::kernels::detail

// comm/: the device half of nccl_collectives: the kernel that sums the staged parts in rank order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace spillway::comm::detail {

/// out[i] = ((x_0[i] + x_1[i]) + ...) + x_{N-1}[i], where x_r is staging + r * n for r != rank
/// and `own` for r == rank. `out` may be `own`. Enqueued on `stream`.
void launch_fixed_order_sum(const float* staging, const float* own, int rank, int ranks,
                            float* out, std::size_t n, cudaStream_t stream);

}  // namespace spillway::comm::detail

// The cuda backend's elementwise kernels: the map kernel over the functors of
// kernels/elementwise_ops.hpp (the cpu launchers run the same, bias add included), and bias
// backward as one thread per column summing rows in order. Both storage types (float, bf16).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/elementwise_ops.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

/// Column j summed over the rows in order by one thread; a grid-stride loop over the columns,
/// since blocks_for caps the grid.
template <class T>
__global__ void bias_backward_kernel(const T* dy, T* dbias, int rows, std::size_t cols, bool accumulate) {
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    float sum = accumulate ? load(dbias[j]) : 0.0f;
    for (int r = 0; r < rows; ++r) sum += load(dy[static_cast<std::size_t>(r) * cols + j]);
    dbias[j] = store_as<T>(sum);
  }
}

}  // namespace

template <class T>
void cuda_bias_backward(kernel_context&, stream s, const T* dy, T* dbias, int rows, int cols, bool accumulate) {
  const auto c = static_cast<std::size_t>(cols);
  SPILLWAY_CUDA_LAUNCH("bias_backward_kernel",
                       bias_backward_kernel<T><<<blocks_for(c), threads_per_block, 0, native(s)>>>(
                           dy, dbias, rows, c, accumulate));
}
template void cuda_bias_backward<float>(kernel_context&, stream, const float*, float*, int, int, bool);
template void cuda_bias_backward<bf16>(kernel_context&, stream, const bf16*, bf16*, int, int, bool);

template <class F>
void cuda_map(const char* kernel, stream s, std::size_t n, const F& f) {
  SPILLWAY_CUDA_MAP(kernel, s, n, f);
}

#define SPILLWAY_INSTANTIATE_CUDA_MAP(F) template void cuda_map<F>(const char*, stream, std::size_t, const F&);
SPILLWAY_ELEMENTWISE_FUNCTORS(SPILLWAY_INSTANTIATE_CUDA_MAP)
#undef SPILLWAY_INSTANTIATE_CUDA_MAP

}  // namespace spillway::kernels::detail

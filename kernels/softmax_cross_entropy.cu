// The cuda backend's softmax with cross-entropy: one block per row (fixed-tree reductions for
// max and sum), then one block that sums the row losses in a fixed order for the mean, and one
// block that reports the first target past the classes. The row kernel is a template over the
// logits' storage type (float or bf16).
#include "kernels/bf16.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/softmax_cross_entropy.hpp"

namespace spillway::kernels::detail {
namespace {

template <class T>
__global__ void softmax_xent_kernel(const T* logits, const std::int32_t* targets, float* losses, T* dlogits,
                                    int cols, float grad_scale) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const T* x = logits + row * cols;
  const std::int32_t t = targets[row];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, load(x[j]));
  mx = block_max(mx, shm);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(load(x[j]) - mx);
  sum = block_sum(sum, shm);
  // A target past the classes is reported by cuda_report_first_outside (an error at synchronize,
  // as on the cpu); here its row is computed as an ignored one, so nothing reads past the row.
  const bool ignored = t < 0 || t >= cols;
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : logf(sum) - (load(x[t]) - mx);
  if (dlogits == nullptr) return;
  __syncthreads();  // dlogits may alias logits: everyone has read x[t] before anyone writes
  T* g = dlogits + row * cols;
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float p = expf(load(x[j]) - mx) * inv;
    g[j] = store_as<T>(ignored ? 0.0f : grad_scale * (p - (j == t ? 1.0f : 0.0f)));
  }
}

__global__ void mean_kernel(const float* losses, int rows, float* mean) {
  __shared__ float shm[threads_per_block];
  float sum = 0.0f;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) sum += losses[r];
  sum = block_sum(sum, shm);
  if (threadIdx.x == 0) *mean = sum / static_cast<float>(rows);
}

}  // namespace

template <class T>
void cuda_softmax_cross_entropy(kernel_context& ctx, stream s, const T* logits, const std::int32_t* targets,
                                float* losses, float* mean_loss, T* dlogits, int rows, int cols, float grad_scale,
                                std::int32_t* report) {
  float* row_loss = losses;
  if (row_loss == nullptr)
    row_loss = static_cast<float*>(ctx.workspace(softmax_cross_entropy_workspace_bytes(rows), "softmax_cross_entropy"));
  SPILLWAY_CUDA_LAUNCH("softmax_xent_kernel",
                       softmax_xent_kernel<T><<<rows, threads_per_block, 0, native(s)>>>(
                           logits, targets, row_loss, dlogits, cols, grad_scale));
  if (mean_loss != nullptr) {
    SPILLWAY_CUDA_LAUNCH("mean_kernel",
                         mean_kernel<<<1, threads_per_block, 0, native(s)>>>(
                             row_loss, rows, mean_loss));
  }
  // Last, so that when a launch above fails the slot is known unwritten and its caller frees it.
  // A negative target ignores its row: only targets >= cols are reported.
  cuda_report_first_outside(s, targets, rows, INT32_MIN, cols, report);
}

template void cuda_softmax_cross_entropy<float>(kernel_context&, stream, const float*, const std::int32_t*, float*,
                                                float*, float*, int, int, float, std::int32_t*);
template void cuda_softmax_cross_entropy<bf16>(kernel_context&, stream, const bf16*, const std::int32_t*, float*,
                                               float*, bf16*, int, int, float, std::int32_t*);

}  // namespace spillway::kernels::detail

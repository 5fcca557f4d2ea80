// The cuda backend's causal softmax (the only part of attention that is not a GEMM): one block
// per score row, fixed-tree reductions over the visible columns j <= i.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

__global__ void causal_softmax_forward_kernel(float* scores, int seq) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const int i = static_cast<int>(row % seq);
  float* x = scores + row * seq;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx, shm);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += expf(x[j] - mx);
  sum = block_sum(sum, shm);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < seq; j += blockDim.x) x[j] = j <= i ? expf(x[j] - mx) * inv : 0.0f;
}

__global__ void causal_softmax_backward_kernel(const float* probs, float* dprobs, int seq, float scale) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const int i = static_cast<int>(row % seq);
  const float* p = probs + row * seq;
  float* d = dprobs + row * seq;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) dot += p[j] * d[j];
  dot = block_sum(dot, shm);
  for (int j = threadIdx.x; j < seq; j += blockDim.x)
    d[j] = j <= i ? scale * ops::softmax_grad(p[j], d[j], dot) : 0.0f;
}

}  // namespace

void cuda_causal_softmax_forward(kernel_context&, stream s, float* scores, int batch, int seq) {
  const unsigned rows = static_cast<unsigned>(batch) * static_cast<unsigned>(seq);
  SPILLWAY_CUDA_LAUNCH("causal_softmax_forward_kernel",
                       causal_softmax_forward_kernel<<<rows, threads_per_block, 0, native(s)>>>(
                           scores, seq));
}

void cuda_causal_softmax_backward(kernel_context&, stream s, const float* probs, float* dprobs, int batch,
                                  int seq, float scale) {
  const unsigned rows = static_cast<unsigned>(batch) * static_cast<unsigned>(seq);
  SPILLWAY_CUDA_LAUNCH("causal_softmax_backward_kernel",
                       causal_softmax_backward_kernel<<<rows, threads_per_block, 0, native(s)>>>(
                           probs, dprobs, seq, scale));
}

}  // namespace spillway::kernels::detail

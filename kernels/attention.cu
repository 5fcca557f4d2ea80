// The cuda backend's causal softmax (the only part of attention that is not a GEMM): one block
// per score row, fixed-tree reductions over the visible columns j <= i; templates over the
// storage type T (float or bf16), widening on load and narrowing once on store.
#include "kernels/bf16.hpp"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_launchers.hpp"
#include "kernels/ops.hpp"

namespace spillway::kernels::detail {
namespace {

template <class T>
__global__ void causal_softmax_forward_kernel(T* scores, int seq) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const int i = static_cast<int>(row % seq);
  T* x = scores + row * seq;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, load(x[j]));
  mx = block_max(mx, shm);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += expf(load(x[j]) - mx);
  sum = block_sum(sum, shm);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < seq; j += blockDim.x) x[j] = store_as<T>(j <= i ? expf(load(x[j]) - mx) * inv : 0.0f);
}

template <class T>
__global__ void causal_softmax_backward_kernel(const T* probs, T* dprobs, int seq, float scale) {
  __shared__ float shm[threads_per_block];
  const std::size_t row = blockIdx.x;
  const int i = static_cast<int>(row % seq);
  const T* p = probs + row * seq;
  T* d = dprobs + row * seq;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) dot += load(p[j]) * load(d[j]);
  dot = block_sum(dot, shm);
  for (int j = threadIdx.x; j < seq; j += blockDim.x)
    d[j] = store_as<T>(j <= i ? scale * ops::softmax_grad(load(p[j]), load(d[j]), dot) : 0.0f);
}

}  // namespace

// One block per score row: rows = batch * seq fits a grid (at most 2^31 - 1 blocks) because
// causal_softmax_forward and _backward refuse larger shapes before they call these.
template <class T>
void cuda_causal_softmax_forward(kernel_context&, stream s, T* scores, int batch, int seq) {
  const unsigned rows = static_cast<unsigned>(batch) * static_cast<unsigned>(seq);
  SPILLWAY_CUDA_LAUNCH("causal_softmax_forward_kernel",
                       causal_softmax_forward_kernel<T><<<rows, threads_per_block, 0, native(s)>>>(
                           scores, seq));
}

template <class T>
void cuda_causal_softmax_backward(kernel_context&, stream s, const T* probs, T* dprobs, int batch, int seq,
                                  float scale) {
  const unsigned rows = static_cast<unsigned>(batch) * static_cast<unsigned>(seq);
  SPILLWAY_CUDA_LAUNCH("causal_softmax_backward_kernel",
                       causal_softmax_backward_kernel<T><<<rows, threads_per_block, 0, native(s)>>>(
                           probs, dprobs, seq, scale));
}

template void cuda_causal_softmax_forward<float>(kernel_context&, stream, float*, int, int);
template void cuda_causal_softmax_forward<bf16>(kernel_context&, stream, bf16*, int, int);
template void cuda_causal_softmax_backward<float>(kernel_context&, stream, const float*, float*, int, int, float);
template void cuda_causal_softmax_backward<bf16>(kernel_context&, stream, const bf16*, bf16*, int, int, float);

}  // namespace spillway::kernels::detail

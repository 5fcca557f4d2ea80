// The cuda backend's launchers, one per public kernel, called by the dispatchers in the .cpp
// files. Declared with plain C++ types so g++ can include this; defined only in CUDA builds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/context.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/ops.hpp"
#include "kernels/pooling.hpp"

namespace spillway::kernels::detail {

// gemm_cuda.cpp (cuBLAS)
void cuda_gemm(kernel_context& ctx, stream s, bool ta, bool tb, int m, int n, int k, float alpha,
               const float* a, int lda, long long stride_a, const float* b, int ldb, long long stride_b,
               float beta, float* c, int ldc, long long stride_c, int batch);

// elementwise.cu
void cuda_bias_add(kernel_context& ctx, stream s, float* y, const float* bias, int rows, int cols);
void cuda_bias_backward(kernel_context& ctx, stream s, const float* dy, float* dbias, int rows, int cols,
                        bool accumulate);
void cuda_gelu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n);
void cuda_gelu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n);
void cuda_relu_forward(kernel_context& ctx, stream s, const float* x, float* y, std::size_t n);
void cuda_relu_backward(kernel_context& ctx, stream s, const float* x, const float* dy, float* dx, std::size_t n);
void cuda_add(kernel_context& ctx, stream s, const float* a, const float* b, float* y, std::size_t n);
void cuda_scale(kernel_context& ctx, stream s, const float* x, float alpha, float* y, std::size_t n);

// softmax_cross_entropy.cu
void cuda_softmax_cross_entropy(kernel_context& ctx, stream s, const float* logits, const std::int32_t* targets,
                                float* losses, float* mean_loss, float* dlogits, int rows, int cols,
                                float grad_scale);

// layer_norm.cu
void cuda_layer_norm_forward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                             const float* beta, float* y, float* mean, float* rstd, int rows, int cols,
                             float eps);
void cuda_layer_norm_backward(kernel_context& ctx, stream s, const float* x, const float* gamma,
                              const float* mean, const float* rstd, const float* dy, float* dx,
                              float* dgamma, float* dbeta, int rows, int cols, bool accumulate);

// embedding.cu
void cuda_embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* table,
                            float* out, int tokens, int vocab, int dim, bool accumulate);
void cuda_embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const float* dout,
                             float* dtable, int tokens, int vocab, int dim, bool accumulate);

// attention.cu
void cuda_causal_softmax_forward(kernel_context& ctx, stream s, float* scores, int batch, int seq);
void cuda_causal_softmax_backward(kernel_context& ctx, stream s, const float* probs, float* dprobs,
                                  int batch, int seq, float scale);

// conv_cuda.cpp (cuDNN)
std::size_t cuda_conv2d_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape);
void cuda_conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                         const float* w, const float* bias, float* y);
void cuda_conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                          const float* w, const float* dy, float* dx, float* dw, float* dbias,
                          bool accumulate);
void cuda_max_pool2d_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x, float* y);
void cuda_max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const float* x,
                              const float* y, const float* dy, float* dx);

// pooling.cu
void cuda_global_avg_pool_forward(kernel_context& ctx, stream s, const float* x, float* y, int batch,
                                  int channels, int plane);
void cuda_global_avg_pool_backward(kernel_context& ctx, stream s, const float* dy, float* dx, int batch,
                                   int channels, int plane);
void cuda_channel_bias_add(kernel_context& ctx, stream s, float* y, const float* bias, int batch,
                           int channels, int plane);
void cuda_channel_bias_backward(kernel_context& ctx, stream s, const float* dy, float* dbias, int batch,
                                int channels, int plane, bool accumulate);

// adam.cu
void cuda_adam_step(kernel_context& ctx, stream s, float* params, const float* grads, float* m, float* v,
                    std::size_t n, const ops::adam_coeffs& c);

}  // namespace spillway::kernels::detail

// The cuda backend's launchers, one per public kernel, called by the dispatchers in the .cpp
// files (SPILLWAY_KERNEL_LAUNCH). A launcher has the type of the kernel it serves: declared by
// that type (decltype) where the kernel has one overload, else as a template over the storage
// type T (float or bf16) whose instantiations the .cu or .cpp defining it lists; the dispatcher
// passes its own pointers, so a launcher cannot drift from its kernel. Defined only in CUDA builds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/ops.hpp"
#include "kernels/attention.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/embedding.hpp"
#include "kernels/grad_norm.hpp"
#include "kernels/layer_norm.hpp"
#include "kernels/pooling.hpp"
#include "kernels/softmax_cross_entropy.hpp"

namespace spillway::kernels::detail {

// gemm_cuda.cpp (cuBLAS): one launcher for every GEMM the dispatchers in gemm.cpp form.
void cuda_gemm(kernel_context& ctx, stream s, bool ta, bool tb, int m, int n, int k, float alpha,
               const float* a, int lda, long long stride_a, const float* b, int ldb, long long stride_b,
               float beta, float* c, int ldc, long long stride_c, int batch);
// The same over bf16 A and B with float32 accumulation; C is float (TC = float) or bf16.
template <class TC>
void cuda_gemm_bf16(kernel_context& ctx, stream s, bool ta, bool tb, int m, int n, int k, float alpha,
                    const bf16* a, int lda, long long stride_a, const bf16* b, int ldb, long long stride_b,
                    float beta, TC* c, int ldc, long long stride_c, int batch);

// elementwise.cu. cuda_map runs f(i) for every i < n on s, for each functor of
// kernels/elementwise_ops.hpp (SPILLWAY_ELEMENTWISE_FUNCTORS); `kernel` names it in errors.
// Bias add runs as a map functor; bias backward for T = float or bf16.
template <class T>
void cuda_bias_backward(kernel_context& ctx, stream s, const T* dy, T* dbias, int rows, int cols,
                        bool accumulate);
template <class F>
void cuda_map(const char* kernel, stream s, std::size_t n, const F& f);

// range_report.cu: one block on s that writes into `report` (a report slot's device address,
// Note [Reports from kernels] in kernels/context.hpp) the least i < n with values[i] outside
// [lo, hi), or -1, and that value. The launchers that report launch it last, so that when one of
// their launches fails the slot is known unwritten and the dispatcher frees it.
void cuda_report_first_outside(stream s, const std::int32_t* values, int n, std::int32_t lo, std::int32_t hi,
                               std::int32_t* report);

// softmax_cross_entropy.cu, layer_norm.cu, embedding.cu, attention.cu: T is float or bf16 (the
// storage of the kernels' overloads), instantiated for both there.
// cuda_softmax_cross_entropy also writes, into `report`, the first row whose target is >= cols
// (or -1) and that target; its dispatcher queues the check that reads it.
template <class T>
void cuda_softmax_cross_entropy(kernel_context& ctx, stream s, const T* logits, const std::int32_t* targets,
                                float* losses, float* mean_loss, T* dlogits, int rows, int cols, float grad_scale,
                                std::int32_t* report);
// layer_norm.cu: T is float or bf16 (the storage of the kernels' overloads).
template <class T>
void cuda_layer_norm_forward(kernel_context& ctx, stream s, const T* x, const T* gamma, const T* beta, T* y,
                             float* mean, float* rstd, int rows, int cols, float eps);
template <class T>
void cuda_layer_norm_backward(kernel_context& ctx, stream s, const T* x, const T* gamma, const float* mean,
                              const float* rstd, const T* dy, T* dx, T* dgamma, T* dbeta, int rows, int cols,
                              bool accumulate);
// Both embedding launchers also write, into `report`, the first token whose id is outside
// [0, vocab) (or -1) and that id; their dispatcher queues the check that reads it.
template <class T>
void cuda_embedding_forward(kernel_context& ctx, stream s, const std::int32_t* ids, const T* table, T* out,
                            int tokens, int vocab, int dim, bool accumulate, std::int32_t* report);
template <class T>
void cuda_embedding_backward(kernel_context& ctx, stream s, const std::int32_t* ids, const T* dout, T* dtable,
                             int tokens, int vocab, int dim, bool accumulate, std::int32_t* report);
template <class T>
void cuda_causal_softmax_forward(kernel_context& ctx, stream s, T* scores, int batch, int seq);
template <class T>
void cuda_causal_softmax_backward(kernel_context& ctx, stream s, const T* probs, T* dprobs, int batch, int seq,
                                  float scale);

// conv_cuda.cpp (cuDNN)
template <class T>
std::size_t cuda_conv2d_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape);
template <class T>
void cuda_conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const T* x, const T* w,
                         const T* bias, T* y);
template <class T>
void cuda_conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const T* x, const T* w,
                          const T* dy, T* dx, T* dw, T* dbias, bool accumulate);

// pooling.cu, T = float or bf16; the per-channel bias pair serves conv2d (its launchers only)
template <class T>
void cuda_max_pool2d_forward(kernel_context& ctx, stream s, const pool2d_shape& shape, const T* x, T* y);
template <class T>
void cuda_max_pool2d_backward(kernel_context& ctx, stream s, const pool2d_shape& shape, const T* x, const T* y,
                              const T* dy, T* dx);
template <class T>
void cuda_global_avg_pool_forward(kernel_context& ctx, stream s, const T* x, T* y, int batch, int channels,
                                  int plane);
template <class T>
void cuda_global_avg_pool_backward(kernel_context& ctx, stream s, const T* dy, T* dx, int batch, int channels,
                                   int plane);
template <class T>
void cuda_channel_bias_add(kernel_context& ctx, stream s, T* y, const T* bias, int batch, int channels, int plane);
template <class T>
void cuda_channel_bias_backward(kernel_context& ctx, stream s, const T* dy, T* dbias, int batch, int channels,
                                int plane, bool accumulate);

// adam.cu
void cuda_adam_step(kernel_context& ctx, stream s, float* params, const float* grads, float* m, float* v,
                    std::size_t n, const ops::adam_coeffs& c);
void cuda_adam_step_mixed(kernel_context& ctx, stream s, float* master, const bf16* grads, float* m, float* v,
                          bf16* weights, std::size_t n, const ops::adam_coeffs& c);

// grad_norm.cu
// grad_norm.cu: T is float or bf16 (the storage of the kernels' overloads).
template <class T>
void cuda_sum_of_squares(kernel_context& ctx, stream s, const T* x, std::size_t n, float* sum_sq, bool accumulate);
template <class T>
void cuda_clip_by_norm(kernel_context& ctx, stream s, T* g, std::size_t n, const float* sum_sq, float max_norm);

}  // namespace spillway::kernels::detail

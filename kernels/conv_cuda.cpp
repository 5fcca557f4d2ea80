// The cuda backend's convolution over cuDNN (legacy API). Algorithms are fixed to deterministic
// ones, FMA math only (no TF32), so results repeat bit for bit; the bias and its gradient are
// Spillway's own kernels (pooling.cu, as is max pooling).
#include <cudnn.h>

#include <type_traits>

#include "kernels/cuda_launchers.hpp"
#include "kernels/cuda_library_check.hpp"

namespace spillway::kernels::detail {
namespace {

/// Owns one cuDNN descriptor; D is the handle type, destroy its destroyer.
template <class D, cudnnStatus_t (*Destroy)(D)>
class descriptor {
 public:
  explicit descriptor(cudnnStatus_t (*create)(D*)) { SPILLWAY_CUDNN_TRY(create(&d_)); }
  ~descriptor() { (void)Destroy(d_); }
  descriptor(const descriptor&) = delete;
  descriptor& operator=(const descriptor&) = delete;
  operator D() const { return d_; }  // NOLINT: implicit by design

 private:
  D d_{};
};

using tensor_desc = descriptor<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using filter_desc = descriptor<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using conv_desc = descriptor<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;

/// cuDNN's name for the storage type T (float or bf16); the arithmetic is float32 for both.
template <class T>
constexpr cudnnDataType_t data_type = std::is_same_v<T, bf16> ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;

void set_nchw(cudnnTensorDescriptor_t d, cudnnDataType_t type, int n, int c, int h, int w) {
  SPILLWAY_CUDNN_TRY(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, type, n, c, h, w));
}

/// The input and output descriptors of an image kernel: x [batch, in_c, height, width] and
/// y [batch, out_c, out_height(), out_width()] of a conv2d_shape.
struct image_descs {
  tensor_desc x{cudnnCreateTensorDescriptor};
  tensor_desc y{cudnnCreateTensorDescriptor};

  template <class Shape>
  image_descs(const Shape& sh, cudnnDataType_t type, int in_c, int out_c) {
    set_nchw(x, type, sh.batch, in_c, sh.height, sh.width);
    set_nchw(y, type, sh.batch, out_c, sh.out_height(), sh.out_width());
  }
};

/// The descriptors of one convolution on data of `type` (float or bf16), computing in float32.
struct conv_setup : image_descs {
  filter_desc w{cudnnCreateFilterDescriptor};
  conv_desc conv{cudnnCreateConvolutionDescriptor};

  conv_setup(const conv2d_shape& sh, cudnnDataType_t type) : image_descs(sh, type, sh.in_channels, sh.out_channels) {
    const window2d& k = sh.kernel;
    SPILLWAY_CUDNN_TRY(cudnnSetFilter4dDescriptor(w, type, CUDNN_TENSOR_NCHW, sh.out_channels,
                                                  sh.in_channels, k.size, k.size));
    SPILLWAY_CUDNN_TRY(cudnnSetConvolution2dDescriptor(conv, k.pad, k.pad, k.stride, k.stride, 1, 1,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    // float32: FMA math, no TF32 (inputs keep their precision). bf16: tensor-core math, whose
    // products of bf16 values are exact and summed in float32; the algorithms stay fixed.
    SPILLWAY_CUDNN_TRY(
        cudnnSetConvolutionMathType(conv, type == CUDNN_DATA_BFLOAT16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  }
};

cudnnHandle_t handle_on(kernel_context& ctx, stream s) {
  auto* h = static_cast<cudnnHandle_t>(ctx.cudnn_handle());
  SPILLWAY_CUDNN_TRY(cudnnSetStream(h, static_cast<cudaStream_t>(s.handle)));
  return h;
}

/// The forward algorithm and its workspace. Both implicit-GEMM algorithms are deterministic; the
/// precomputed one is faster where cuDNN has it for the shape, the plain one supports every
/// shape without workspace.
cudnnConvolutionFwdAlgo_t forward_algo(cudnnHandle_t h, const conv_setup& d, std::size_t& bytes) {
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  bytes = 0;
  if (cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, algo, &bytes) != CUDNN_STATUS_SUCCESS) {
    algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    SPILLWAY_CUDNN_TRY(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, algo, &bytes));
  }
  return algo;
}

constexpr cudnnConvolutionBwdDataAlgo_t data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;      // deterministic
constexpr cudnnConvolutionBwdFilterAlgo_t filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;  // deterministic

std::size_t data_workspace(cudnnHandle_t h, const conv_setup& d) {
  std::size_t bytes = 0;
  SPILLWAY_CUDNN_TRY(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, data_algo, &bytes));
  return bytes;
}

std::size_t filter_workspace(cudnnHandle_t h, const conv_setup& d) {
  std::size_t bytes = 0;
  SPILLWAY_CUDNN_TRY(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, filter_algo, &bytes));
  return bytes;
}

}  // namespace

template <class T>
std::size_t cuda_conv2d_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape) {
  if (shape.batch == 0) return 0;  // no descriptor takes an empty batch; nothing runs
  auto* h = static_cast<cudnnHandle_t>(ctx.cudnn_handle());
  const conv_setup d(shape, data_type<T>);
  std::size_t fwd = 0;
  (void)forward_algo(h, d, fwd);
  std::size_t bytes = fwd;
  for (std::size_t b : {data_workspace(h, d), filter_workspace(h, d)}) bytes = b > bytes ? b : bytes;
  return (bytes + 255) / 256 * 256;
}

template <class T>
void cuda_conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const T* x, const T* w,
                         const T* bias, T* y) {
  cudnnHandle_t h = handle_on(ctx, s);
  const conv_setup d(shape, data_type<T>);
  std::size_t bytes = 0;
  const cudnnConvolutionFwdAlgo_t algo = forward_algo(h, d, bytes);
  void* ws = bytes > 0 ? ctx.workspace(bytes, "conv2d_forward") : nullptr;
  const float one = 1.0f;
  const float zero = 0.0f;
  SPILLWAY_CUDNN_TRY(cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, algo, ws, bytes, &zero, d.y, y));
  if (bias != nullptr)
    cuda_channel_bias_add(ctx, s, y, bias, shape.batch, shape.out_channels, shape.out_height() * shape.out_width());
}

template <class T>
void cuda_conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const T* x, const T* w,
                          const T* dy, T* dx, T* dw, T* dbias, bool accumulate) {
  if (shape.batch == 0) {
    // cuDNN takes no empty batch (CUDNN_STATUS_BAD_PARAM); the sums over no images are zero, as
    // the cpu launcher leaves them.
    if (!accumulate) {
      const auto r = static_cast<std::size_t>(shape.kernel.size);
      const std::size_t w_elements =
          static_cast<std::size_t>(shape.out_channels) * static_cast<std::size_t>(shape.in_channels) * r * r;
      SPILLWAY_CUDA_TRY(cudaMemsetAsync(dw, 0, w_elements * sizeof(T), static_cast<cudaStream_t>(s.handle)));
      if (dbias != nullptr)
        SPILLWAY_CUDA_TRY(cudaMemsetAsync(dbias, 0, static_cast<std::size_t>(shape.out_channels) * sizeof(T),
                                          static_cast<cudaStream_t>(s.handle)));
    }
    return;
  }
  cudnnHandle_t h = handle_on(ctx, s);
  const conv_setup d(shape, data_type<T>);
  const std::size_t data_bytes = dx != nullptr ? data_workspace(h, d) : 0;
  const std::size_t filter_bytes = filter_workspace(h, d);
  const std::size_t bytes = data_bytes > filter_bytes ? data_bytes : filter_bytes;
  void* ws = bytes > 0 ? ctx.workspace(bytes, "conv2d_backward") : nullptr;
  const float one = 1.0f;
  const float zero = 0.0f;
  const float filter_beta = accumulate ? 1.0f : 0.0f;
  if (dx != nullptr)
    SPILLWAY_CUDNN_TRY(cudnnConvolutionBackwardData(h, &one, d.w, w, d.y, dy, d.conv, data_algo, ws, data_bytes,
                                                    &zero, d.x, dx));
  SPILLWAY_CUDNN_TRY(cudnnConvolutionBackwardFilter(h, &one, d.x, x, d.y, dy, d.conv, filter_algo, ws,
                                                    filter_bytes, &filter_beta, d.w, dw));
  if (dbias != nullptr)
    cuda_channel_bias_backward(ctx, s, dy, dbias, shape.batch, shape.out_channels,
                               shape.out_height() * shape.out_width(), accumulate);
}

#define SPILLWAY_CONV2D_LAUNCHERS(T)                                                                            \
  template std::size_t cuda_conv2d_workspace_bytes<T>(kernel_context&, const conv2d_shape&);                    \
  template void cuda_conv2d_forward<T>(kernel_context&, stream, const conv2d_shape&, const T*, const T*, const T*, \
                                       T*);                                                                     \
  template void cuda_conv2d_backward<T>(kernel_context&, stream, const conv2d_shape&, const T*, const T*,       \
                                        const T*, T*, T*, T*, bool);
SPILLWAY_CONV2D_LAUNCHERS(float)
SPILLWAY_CONV2D_LAUNCHERS(bf16)
#undef SPILLWAY_CONV2D_LAUNCHERS

}  // namespace spillway::kernels::detail

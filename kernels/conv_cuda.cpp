// The cuda backend's convolution over cuDNN (legacy API). Algorithms are fixed to deterministic
// ones, FMA math only (no TF32), so results repeat bit for bit; the bias and its gradient are
// Spillway's own kernels (pooling.cu, as is max pooling).
#include <cudnn.h>

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

void set_nchw(cudnnTensorDescriptor_t d, int n, int c, int h, int w) {
  SPILLWAY_CUDNN_TRY(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
}

/// The input and output descriptors of an image kernel: x [batch, in_c, height, width] and
/// y [batch, out_c, out_height(), out_width()] of a conv2d_shape.
struct image_descs {
  tensor_desc x{cudnnCreateTensorDescriptor};
  tensor_desc y{cudnnCreateTensorDescriptor};

  template <class Shape>
  image_descs(const Shape& sh, int in_c, int out_c) {
    set_nchw(x, sh.batch, in_c, sh.height, sh.width);
    set_nchw(y, sh.batch, out_c, sh.out_height(), sh.out_width());
  }
};

/// The descriptors of one convolution.
struct conv_setup : image_descs {
  filter_desc w{cudnnCreateFilterDescriptor};
  conv_desc conv{cudnnCreateConvolutionDescriptor};

  explicit conv_setup(const conv2d_shape& sh) : image_descs(sh, sh.in_channels, sh.out_channels) {
    const window2d& k = sh.kernel;
    SPILLWAY_CUDNN_TRY(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, sh.out_channels,
                                                  sh.in_channels, k.size, k.size));
    SPILLWAY_CUDNN_TRY(cudnnSetConvolution2dDescriptor(conv, k.pad, k.pad, k.stride, k.stride, 1, 1,
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    SPILLWAY_CUDNN_TRY(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
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

std::size_t cuda_conv2d_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape) {
  auto* h = static_cast<cudnnHandle_t>(ctx.cudnn_handle());
  const conv_setup d(shape);
  std::size_t fwd = 0;
  (void)forward_algo(h, d, fwd);
  std::size_t bytes = fwd;
  for (std::size_t b : {data_workspace(h, d), filter_workspace(h, d)}) bytes = b > bytes ? b : bytes;
  return (bytes + 255) / 256 * 256;
}

void cuda_conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                         const float* w, const float* bias, float* y) {
  cudnnHandle_t h = handle_on(ctx, s);
  const conv_setup d(shape);
  std::size_t bytes = 0;
  const cudnnConvolutionFwdAlgo_t algo = forward_algo(h, d, bytes);
  void* ws = bytes > 0 ? ctx.workspace(bytes, "conv2d_forward") : nullptr;
  const float one = 1.0f;
  const float zero = 0.0f;
  SPILLWAY_CUDNN_TRY(cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, algo, ws, bytes, &zero, d.y, y));
  if (bias != nullptr)
    cuda_channel_bias_add(ctx, s, y, bias, shape.batch, shape.out_channels, shape.out_height() * shape.out_width());
}

void cuda_conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                          const float* w, const float* dy, float* dx, float* dw, float* dbias,
                          bool accumulate) {
  cudnnHandle_t h = handle_on(ctx, s);
  const conv_setup d(shape);
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

}  // namespace spillway::kernels::detail

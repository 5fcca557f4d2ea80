// 2-D convolution: forward against a direct float64 convolution for several strides and
// paddings, backward (dx, dw, dbias) by finite differences, accumulation, cuda against cpu.
#include <gtest/gtest.h>

#include <string>

#include "kernel_rig.hpp"
#include "kernels/conv2d.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

std::vector<double> conv_ref(const conv2d_shape& sh, const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& b) {
  const int P = sh.out_height(), Q = sh.out_width(), R = sh.kernel.size;
  std::vector<double> y(static_cast<std::size_t>(sh.batch) * sh.out_channels * P * Q);
  for (int n = 0; n < sh.batch; ++n)
    for (int k = 0; k < sh.out_channels; ++k)
      for (int p = 0; p < P; ++p)
        for (int q = 0; q < Q; ++q) {
          double s = b.empty() ? 0.0 : b[k];
          for (int c = 0; c < sh.in_channels; ++c)
            for (int i = 0; i < R; ++i)
              for (int j = 0; j < R; ++j) {
                const int yy = p * sh.kernel.stride - sh.kernel.pad + i, xx = q * sh.kernel.stride - sh.kernel.pad + j;
                if (yy < 0 || yy >= sh.height || xx < 0 || xx >= sh.width) continue;
                s += x[((n * sh.in_channels + c) * sh.height + yy) * sh.width + xx] *
                     w[((k * sh.in_channels + c) * R + i) * R + j];
              }
          y[((n * sh.out_channels + k) * P + p) * Q + q] = s;
        }
  return y;
}

std::size_t x_size(const conv2d_shape& sh) {
  return static_cast<std::size_t>(sh.batch) * sh.in_channels * sh.height * sh.width;
}
std::size_t w_size(const conv2d_shape& sh) {
  return static_cast<std::size_t>(sh.out_channels) * sh.in_channels * sh.kernel.size * sh.kernel.size;
}
std::size_t y_size(const conv2d_shape& sh) {
  return static_cast<std::size_t>(sh.batch) * sh.out_channels * sh.out_height() * sh.out_width();
}

class ConvShapes : public ::testing::TestWithParam<conv2d_shape> {};

}  // namespace

TEST_P(ConvShapes, ForwardMatchesFloat64AndBackwardMatchesFiniteDifferences) {
  const conv2d_shape sh = GetParam();
  const auto x = random_floats(x_size(sh), 1);
  const auto w = random_floats(w_size(sh), 2);
  const auto b = random_floats(sh.out_channels, 3);
  const auto up = random_floats(y_size(sh), 4);
  rig r;
  const float* dx_in = r.up(x);
  const float* dw_in = r.up(w);
  float* y = r.alloc<float>(y_size(sh));
  conv2d_forward(r.ctx(), r.s(), sh, dx_in, dw_in, r.up(b), y);
  const auto X = widen(x), W = widen(w), B = widen(b), U = widen(up);
  expect_near_all(r.down(y, y_size(sh)), conv_ref(sh, X, W, B), 1e-5, 1e-5, "y");

  float* gx = r.alloc<float>(x_size(sh));
  float* gw = r.alloc<float>(w_size(sh));
  float* gb = r.alloc<float>(sh.out_channels);
  const float* dy = r.up(up);
  conv2d_backward(r.ctx(), r.s(), sh, dx_in, dw_in, dy, gx, gw, gb, false);
  auto loss = [&](const auto& xx, const auto& ww, const auto& bb) { return dot(conv_ref(sh, xx, ww, bb), U); };
  expect_near_all(r.down(gx, x_size(sh)), numeric_gradient([&](const auto& v) { return loss(v, W, B); }, X), 1e-4,
                  1e-3, "dx");
  expect_near_all(r.down(gw, w_size(sh)), numeric_gradient([&](const auto& v) { return loss(X, v, B); }, W), 1e-4,
                  1e-3, "dw");
  expect_near_all(r.down(gb, sh.out_channels), numeric_gradient([&](const auto& v) { return loss(X, W, v); }, B),
                  1e-4, 1e-3, "dbias");

  const auto gw1 = r.down(gw, w_size(sh));
  conv2d_backward(r.ctx(), r.s(), sh, dx_in, dw_in, dy, nullptr, gw, nullptr, true);
  const auto gw2 = r.down(gw, w_size(sh));
  for (std::size_t i = 0; i < gw1.size(); ++i) EXPECT_NEAR(gw2[i], 2 * gw1[i], 1e-4);
}

INSTANTIATE_TEST_SUITE_P(StridesAndPadding, ConvShapes,
                         ::testing::Values(conv2d_shape{2, 3, 6, 6, 4, {3, 1, 1}},   // 3x3 same
                                           conv2d_shape{2, 3, 7, 6, 4, {3, 2, 1}},   // 3x3 stride 2
                                           conv2d_shape{1, 4, 5, 5, 2, {1, 2, 0}},   // 1x1 projection shortcut
                                           conv2d_shape{1, 2, 9, 9, 3, {5, 2, 2}})); // a wide stem

TEST(Conv2d, RejectsAKernelLargerThanThePaddedImage) {
  rig r;
  float* d = r.alloc<float>(64);
  EXPECT_THROW(conv2d_forward(r.ctx(), r.s(), conv2d_shape{1, 1, 2, 2, 1, {5, 1, 1}}, d, d, nullptr, d),
               spillway::usage_error);
}

TEST(Conv2d, AnEmptyOrNegativeImageIsRefusedBeforeAnyWork) {
  // A height or width of 0 (or less) leaves nothing to convolve: refused at the call on every
  // backend (cuDNN takes no such descriptor either), naming the shape. The pointers are never read.
  rig r;
  float* d = r.alloc<float>(64);
  for (const conv2d_shape& sh : {conv2d_shape{1, 1, 0, 4, 1, {3, 1, 1}}, conv2d_shape{1, 1, 4, 0, 1, {3, 1, 1}},
                                 conv2d_shape{1, 1, -1, 4, 1, {1, 1, 1}}, conv2d_shape{1, 1, 4, -5, 1, {1, 1, 3}}}) {
    const std::string shape = std::to_string(sh.height) + ", " + std::to_string(sh.width);
    try {
      conv2d_forward(r.ctx(), r.s(), sh, d, d, nullptr, d);
      r.sync();
      ADD_FAILURE() << "forward took a " << shape << " image";
      continue;
    } catch (const spillway::usage_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("conv2d_forward"), std::string::npos) << what;
      EXPECT_NE(what.find(shape), std::string::npos) << what;
      EXPECT_NE(what.find("height and width must be at least 1"), std::string::npos) << what;
    }
    EXPECT_THROW(conv2d_backward(r.ctx(), r.s(), sh, d, d, d, d, d, d, false), spillway::usage_error) << shape;
    EXPECT_THROW((void)conv2d_workspace_bytes(r.ctx(), sh), spillway::usage_error) << shape;
  }
  r.sync();
}

TEST(Conv2d, RefusesTensorsOverCudnnsElementLimitOnEveryBackend) {
  // 64 x 512 x 256 x 256 is 2^31 elements: cuDNN's descriptors refuse it, so the cpu backend
  // does too, before any work (the pointers are never read).
  rig r;
  float* d = r.alloc<float>(16);
  const conv2d_shape big{64, 512, 256, 256, 8, {1, 1, 0}};
  try {
    conv2d_forward(r.ctx(), r.s(), big, d, d, nullptr, d);
    FAIL() << "a 2^31-element input was taken";
  } catch (const spillway::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("split the batch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(conv2d_backward(r.ctx(), r.s(), big, d, d, d, d, d, nullptr, false), spillway::usage_error);
  EXPECT_THROW((void)conv2d_workspace_bytes(r.ctx(), big), spillway::usage_error);
  // The output counts too: 8 input channels, 2^31 output elements.
  const conv2d_shape wide_out{64, 8, 256, 256, 512, {1, 1, 0}};
  EXPECT_THROW(conv2d_forward(r.ctx(), r.s(), wide_out, d, d, nullptr, d), spillway::usage_error);
  // One image fewer is within the limit: the check passes (only the workspace query runs).
  EXPECT_EQ(conv2d_workspace_bytes(r.ctx(), conv2d_shape{63, 512, 256, 256, 8, {1, 1, 0}}), 0u);
}

namespace {
// The weight and bias gradients of an empty batch: added to, nothing; overwritten, zero. The
// cuda launcher does it without cuDNN (which takes no empty batch), the cpu one by its loops.
void expect_empty_batch_backward(rig& r) {
  const conv2d_shape sh{0, 2, 5, 5, 3, {3, 1, 1}};
  const std::vector<float> seven(w_size(sh), 7.0f), bias_seven(3, 7.0f);
  float* x = r.alloc<float>(4);
  float* gw = r.up(seven);
  float* gb = r.up(bias_seven);
  conv2d_backward(r.ctx(), r.s(), sh, x, x, x, nullptr, gw, gb, true);
  EXPECT_EQ(r.down(gw, w_size(sh)), seven);
  EXPECT_EQ(r.down(gb, 3), bias_seven);
  conv2d_backward(r.ctx(), r.s(), sh, x, x, x, nullptr, gw, gb, false);
  EXPECT_EQ(r.down(gw, w_size(sh)), std::vector<float>(w_size(sh), 0.0f));
  EXPECT_EQ(r.down(gb, 3), std::vector<float>(3, 0.0f));
  EXPECT_EQ(conv2d_workspace_bytes(r.ctx(), sh), 0u);
}
}  // namespace

TEST(Conv2d, BackwardOfAnEmptyBatchLeavesZeroSumsOrAddsNothing) {
  rig r;
  expect_empty_batch_backward(r);
}

TEST(Conv2dCuda, BackwardOfAnEmptyBatchLeavesZeroSumsOrAddsNothing) {
  SPILLWAY_NEEDS_CUDA();
  rig r("cuda");
  expect_empty_batch_backward(r);
}

TEST(Conv2dCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const conv2d_shape sh{4, 16, 16, 16, 32, {3, 2, 1}};
  const auto x = random_floats(x_size(sh), 5);
  const auto w = random_floats(w_size(sh), 6);
  const auto b = random_floats(sh.out_channels, 7);
  const auto up = random_floats(y_size(sh), 8);
  auto run = [&](rig& r) {
    const float* dx = r.up(x);
    const float* dw = r.up(w);
    float* y = r.alloc<float>(y_size(sh));
    conv2d_forward(r.ctx(), r.s(), sh, dx, dw, r.up(b), y);
    float* gx = r.alloc<float>(x_size(sh));
    float* gw = r.alloc<float>(w_size(sh));
    float* gb = r.alloc<float>(sh.out_channels);
    conv2d_backward(r.ctx(), r.s(), sh, dx, dw, r.up(up), gx, gw, gb, false);
    return std::vector<std::vector<float>>{r.down(y, y_size(sh)), r.down(gx, x_size(sh)), r.down(gw, w_size(sh)),
                                           r.down(gb, sh.out_channels)};
  };
  rig cpu("cpu"), gpu("cuda");
  const auto want = run(cpu);
  const auto got = run(gpu);
  for (std::size_t i = 0; i < want.size(); ++i) expect_near_all(got[i], want[i], 1e-4, 1e-4, "output " + std::to_string(i));
}

// Elementwise kernels and the bias pair against float64 references; activation gradients by
// finite differences; in-place use; cuda against cpu.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <thread>

#include "kernel_rig.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/ops.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEST(BiasAdd, AddsTheBiasToEveryRow) {
  const int rows = 7, cols = 13;
  const auto y = random_floats(rows * cols, 1);
  const auto b = random_floats(cols, 2);
  rig r;
  float* dy = r.up(y);
  bias_add(r.ctx(), r.s(), dy, r.up(b), rows, cols);
  const auto got = r.down(dy, rows * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) EXPECT_FLOAT_EQ(got[i * cols + j], y[i * cols + j] + b[j]);
}

TEST(BiasBackward, SumsColumnsAndAccumulates) {
  const int rows = 300, cols = 70;  // more columns than one parallel chunk
  const auto g = random_floats(rows * cols, 3);
  rig r;
  const float* dg = r.up(g);
  float* db = r.up(std::vector<float>(cols, 100.0f));
  bias_backward(r.ctx(), r.s(), dg, db, rows, cols, false);
  std::vector<double> want(cols, 0.0);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) want[j] += g[i * cols + j];
  expect_near_all(r.down(db, cols), want, 1e-4);
  bias_backward(r.ctx(), r.s(), dg, db, rows, cols, true);
  for (auto& w : want) w *= 2;
  expect_near_all(r.down(db, cols), want, 2e-4);
}

TEST(Gelu, ForwardMatchesFloat64AndBackwardMatchesFiniteDifferences) {
  const std::size_t n = 5000;
  const auto x = random_floats(n, 4, -6.0f, 6.0f);
  const auto dy = random_floats(n, 5);
  rig r;
  const float* dx_in = r.up(x);
  float* y = r.alloc<float>(n);
  gelu_forward(r.ctx(), r.s(), dx_in, y, n);
  std::vector<double> want(n), want_grad(n);
  for (std::size_t i = 0; i < n; ++i) {
    want[i] = gelu_ref(x[i]);
    const double h = 1e-5;
    want_grad[i] = dy[i] * (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
  }
  expect_near_all(r.down(y, n), want, 1e-6, 1e-5, "gelu");
  float* g = r.up(dy);
  gelu_backward(r.ctx(), r.s(), dx_in, g, g, n);  // in place over dy
  expect_near_all(r.down(g, n), want_grad, 1e-5, 1e-4, "gelu'");
}

TEST(Gelu, SharedBodyHasKnownValues) {
  EXPECT_FLOAT_EQ(ops::gelu(0.0f), 0.0f);
  EXPECT_NEAR(ops::gelu(1.0f), 0.841192, 1e-6);
  EXPECT_NEAR(ops::gelu(-1.0f), -0.158808, 1e-6);
  EXPECT_NEAR(ops::gelu_grad(0.0f), 0.5, 1e-7);
}

TEST(Relu, ForwardAndBackward) {
  const std::vector<float> x = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f};
  const std::vector<float> dy = {1, 2, 3, 4, 5};
  rig r;
  const float* dxin = r.up(x);
  float* y = r.alloc<float>(x.size());
  relu_forward(r.ctx(), r.s(), dxin, y, x.size());
  EXPECT_EQ(r.down(y, x.size()), (std::vector<float>{0, 0, 0, 0.5f, 3}));
  float* g = r.alloc<float>(x.size());
  relu_backward(r.ctx(), r.s(), dxin, r.up(dy), g, x.size());
  EXPECT_EQ(r.down(g, x.size()), (std::vector<float>{0, 0, 0, 4, 5}));
}

namespace {
constexpr float pos_inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
// x, dy, and what ReLU gives for them: a NaN x stays NaN forward (a diverged layer shows), and
// the gradient is dy where x > 0 and exactly 0 elsewhere, even for an inf or NaN dy.
const std::vector<float> relu_x = {qnan, -1.0f, 0.0f, -0.0f, 2.0f, -pos_inf, pos_inf, 3.0f, -qnan};
const std::vector<float> relu_dy = {1.0f, pos_inf, qnan, -pos_inf, 3.0f, qnan, qnan, -pos_inf, 5.0f};
const std::vector<float> relu_y = {qnan, 0.0f, 0.0f, 0.0f, 2.0f, 0.0f, pos_inf, 3.0f, -qnan};
const std::vector<float> relu_dx = {0.0f, 0.0f, 0.0f, 0.0f, 3.0f, 0.0f, qnan, -pos_inf, 0.0f};

void expect_relu_specials(rig& r) {
  const float* x = r.up(relu_x);
  float* y = r.alloc<float>(relu_x.size());
  relu_forward(r.ctx(), r.s(), x, y, relu_x.size());
  EXPECT_TRUE(same_bits(r.down(y, relu_x.size()), relu_y));
  float* g = r.up(relu_dy);
  relu_backward(r.ctx(), r.s(), x, g, g, relu_x.size());  // in place, as the header allows
  EXPECT_TRUE(same_bits(r.down(g, relu_x.size()), relu_dx));
}
}  // namespace

TEST(Relu, NanPropagatesForwardAndTheGradientIsZeroWhereXIsNotPositive) {
  EXPECT_TRUE(std::isnan(ops::relu(qnan)));
  EXPECT_EQ(ops::relu(-pos_inf), 0.0f);
  rig r;
  expect_relu_specials(r);
}

TEST(ReluCuda, NanAndInfMatchTheCpuBitForBit) {
  SPILLWAY_NEEDS_CUDA();
  rig gpu("cuda");
  expect_relu_specials(gpu);
}

TEST(AddAndScale, ResidualAddInPlaceAndScale) {
  const std::size_t n = 40000;  // several parallel chunks
  const auto a = random_floats(n, 6);
  const auto b = random_floats(n, 7);
  rig r;
  float* da = r.up(a);
  add(r.ctx(), r.s(), da, r.up(b), da, n);
  const auto sum = r.down(da, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(sum[i], a[i] + b[i]) << i;
  scale(r.ctx(), r.s(), da, -0.5f, da, n);
  const auto half = r.down(da, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(half[i], -0.5f * (a[i] + b[i])) << i;
}

TEST(ElementwiseCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const int rows = 33, cols = 257;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const auto x = random_floats(n, 8, -4.0f, 4.0f);
  const auto dy = random_floats(n, 9);
  const auto bias = random_floats(cols, 10);
  auto run = [&](rig& r) {
    std::vector<std::vector<float>> out;
    const float* dx = r.up(x);
    const float* g = r.up(dy);
    float* y = r.alloc<float>(n);
    gelu_forward(r.ctx(), r.s(), dx, y, n);
    out.push_back(r.down(y, n));
    gelu_backward(r.ctx(), r.s(), dx, g, y, n);
    out.push_back(r.down(y, n));
    relu_forward(r.ctx(), r.s(), dx, y, n);
    out.push_back(r.down(y, n));
    relu_backward(r.ctx(), r.s(), dx, g, y, n);
    out.push_back(r.down(y, n));
    add(r.ctx(), r.s(), dx, g, y, n);
    out.push_back(r.down(y, n));
    scale(r.ctx(), r.s(), y, 0.3f, y, n);
    out.push_back(r.down(y, n));
    bias_add(r.ctx(), r.s(), y, r.up(bias), rows, cols);
    out.push_back(r.down(y, n));
    float* db = r.alloc<float>(cols);
    bias_backward(r.ctx(), r.s(), g, db, rows, cols, false);
    out.push_back(r.down(db, cols));
    return out;
  };
  rig cpu("cpu"), gpu("cuda");
  const auto want = run(cpu);
  const auto got = run(gpu);
  for (std::size_t i = 0; i < want.size(); ++i) expect_near_all(got[i], want[i], 1e-5, 1e-5, "output " + std::to_string(i));
}

TEST(LaunchContract, KernelsRunInStreamOrderNotAtTheCall) {
  rig r;
  const std::vector<float> x = {1, 2, 3, 4};
  const float* dx = r.up(x);
  float* y = r.alloc<float>(4);
  r.sync();
  std::promise<void> gate = r.hold_stream();  // holds the stream like a long kernel
  scale(r.ctx(), r.s(), dx, 2.0f, y, 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<float> early(4);
  std::memcpy(early.data(), y, sizeof(float) * 4);  // cpu backend: device memory is host memory
  EXPECT_EQ(early, std::vector<float>(4, 0.0f));
  gate.set_value();
  EXPECT_EQ(r.down(y, 4), (std::vector<float>{2, 4, 6, 8}));
}

// Past 2^28 threads (the most blocks_for gives a grid, times 256): the kernel must cover the rest
// with a grid-stride loop. The output starts as NaN bytes; every element must come out 0.
TEST(BiasBackwardCuda, CoversMoreColumnsThanTheGridHasThreads) {
  SPILLWAY_NEEDS_CUDA();
  const int cols = (1 << 28) + 1024;
  const auto c = static_cast<std::size_t>(cols);
  rig r("cuda");
  const float* dy = r.alloc<float>(c);  // one row of zeros
  float* db = r.alloc<float>(c);
  r.dev().memset_async(db, 0xff, c * sizeof(float), r.s());
  bias_backward(r.ctx(), r.s(), dy, db, 1, cols, false);
  EXPECT_EQ(r.down(db + c - 4096, 4096), std::vector<float>(4096, 0.0f));
}

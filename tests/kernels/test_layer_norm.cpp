// Layer norm: forward and saved statistics against float64, backward (dx, dgamma, dbeta) by
// finite differences, accumulation, cuda against cpu.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_rig.hpp"
#include "kernels/layer_norm.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

constexpr double eps = 1e-5;

std::vector<double> ln_ref(const std::vector<double>& x, const std::vector<double>& g, const std::vector<double>& b,
                           int rows, int cols) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int j = 0; j < cols; ++j) mu += x[r * cols + j];
    mu /= cols;
    for (int j = 0; j < cols; ++j) var += (x[r * cols + j] - mu) * (x[r * cols + j] - mu);
    var /= cols;
    for (int j = 0; j < cols; ++j) y[r * cols + j] = (x[r * cols + j] - mu) / std::sqrt(var + eps) * g[j] + b[j];
  }
  return y;
}

}  // namespace

TEST(LayerNorm, ForwardAndBackwardMatchFloat64AndFiniteDifferences) {
  const int rows = 5, cols = 24;
  const auto x = random_floats(rows * cols, 1, -2.0f, 2.0f);
  const auto g = random_floats(cols, 2, 0.5f, 1.5f);
  const auto b = random_floats(cols, 3);
  const auto up = random_floats(rows * cols, 4);  // dL/dy
  rig r;
  const float* dx_in = r.up(x);
  const float* dg = r.up(g);
  const float* db = r.up(b);
  float* y = r.alloc<float>(rows * cols);
  float* mean = r.alloc<float>(rows);
  float* rstd = r.alloc<float>(rows);
  layer_norm_forward(r.ctx(), r.s(), dx_in, dg, db, y, mean, rstd, rows, cols, static_cast<float>(eps));
  const auto X = widen(x), G = widen(g), B = widen(b), U = widen(up);
  expect_near_all(r.down(y, rows * cols), ln_ref(X, G, B, rows, cols), 1e-5, 1e-5, "y");
  const auto mu = r.down(mean, rows);
  for (int i = 0; i < rows; ++i) {
    double m = 0;
    for (int j = 0; j < cols; ++j) m += x[i * cols + j];
    EXPECT_NEAR(mu[i], m / cols, 1e-6);
  }

  float* gx = r.alloc<float>(rows * cols);
  float* gg = r.alloc<float>(cols);
  float* gb = r.alloc<float>(cols);
  layer_norm_backward(r.ctx(), r.s(), dx_in, dg, mean, rstd, r.up(up), gx, gg, gb, rows, cols, false);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& gg2, const std::vector<double>& bb) {
    return dot(ln_ref(xx, gg2, bb, rows, cols), U);
  };
  expect_near_all(r.down(gx, rows * cols), numeric_gradient([&](const auto& v) { return loss(v, G, B); }, X), 1e-4,
                  1e-3, "dx");
  expect_near_all(r.down(gg, cols), numeric_gradient([&](const auto& v) { return loss(X, v, B); }, G), 1e-4, 1e-3,
                  "dgamma");
  expect_near_all(r.down(gb, cols), numeric_gradient([&](const auto& v) { return loss(X, G, v); }, B), 1e-4, 1e-3,
                  "dbeta");

  const auto gg1 = r.down(gg, cols);
  layer_norm_backward(r.ctx(), r.s(), dx_in, dg, mean, rstd, r.up(up), gx, gg, gb, rows, cols, true);
  const auto gg2 = r.down(gg, cols);
  for (int j = 0; j < cols; ++j) EXPECT_NEAR(gg2[j], 2 * gg1[j], 1e-5);
}

TEST(LayerNorm, RowsFarFromZeroKeepTheirStatisticsExact) {
  // Values near 10000 with a spread of 1: a float32 running sum of a 1024-column row drops most
  // of each value's fraction (the sum's last bit is worth 1), which put the mean off by far
  // more than the spread. Summed in float64 the statistics are exact and y is float32-accurate.
  const int rows = 4, cols = 1024;
  auto x = random_floats(rows * cols, 9, -1.0f, 1.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += 10000.0f + static_cast<float>(i % 3);
  const auto g = random_floats(cols, 10, 0.5f, 1.5f);
  const auto b = random_floats(cols, 11);
  rig r;
  float* y = r.alloc<float>(rows * cols);
  float* mean = r.alloc<float>(rows);
  float* rstd = r.alloc<float>(rows);
  layer_norm_forward(r.ctx(), r.s(), r.up(x), r.up(g), r.up(b), y, mean, rstd, rows, cols, static_cast<float>(eps));
  expect_near_all(r.down(y, rows * cols), ln_ref(widen(x), widen(g), widen(b), rows, cols), 1e-5, 1e-5, "y");
  const auto mu = r.down(mean, rows);
  const auto rs = r.down(rstd, rows);
  for (int i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (int j = 0; j < cols; ++j) m += x[i * cols + j];
    m /= cols;
    for (int j = 0; j < cols; ++j) v += (x[i * cols + j] - m) * (x[i * cols + j] - m);
    v /= cols;
    EXPECT_EQ(mu[i], static_cast<float>(m)) << "row " << i;
    EXPECT_NEAR(rs[i], 1.0 / std::sqrt(v + eps), 1e-6 / std::sqrt(v + eps)) << "row " << i;
  }
}

TEST(LayerNormCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const int rows = 64, cols = 768;
  const auto x = random_floats(rows * cols, 5, -3.0f, 3.0f);
  const auto g = random_floats(cols, 6, 0.5f, 1.5f);
  const auto b = random_floats(cols, 7);
  const auto up = random_floats(rows * cols, 8);
  auto run = [&](rig& r) {
    const float* dx = r.up(x);
    const float* dg = r.up(g);
    float* y = r.alloc<float>(rows * cols);
    float* mean = r.alloc<float>(rows);
    float* rstd = r.alloc<float>(rows);
    layer_norm_forward(r.ctx(), r.s(), dx, dg, r.up(b), y, mean, rstd, rows, cols);
    float* gx = r.alloc<float>(rows * cols);
    float* gg = r.alloc<float>(cols);
    float* gb = r.alloc<float>(cols);
    layer_norm_backward(r.ctx(), r.s(), dx, dg, mean, rstd, r.up(up), gx, gg, gb, rows, cols, false);
    std::vector<std::vector<float>> out = {r.down(y, rows * cols), r.down(gx, rows * cols), r.down(gg, cols),
                                           r.down(gb, cols)};
    return out;
  };
  rig cpu("cpu"), gpu("cuda");
  const auto want = run(cpu);
  const auto got = run(gpu);
  for (std::size_t i = 0; i < want.size(); ++i) expect_near_all(got[i], want[i], 1e-4, 1e-4, "output " + std::to_string(i));
}

// Past 2^28 threads (the most blocks_for gives a grid, times 256): the kernel must cover the rest
// with a grid-stride loop. The output starts as NaN bytes; every element must come out 0.
TEST(LayerNormCuda, ParameterGradientsCoverMoreColumnsThanTheGridHasThreads) {
  SPILLWAY_NEEDS_CUDA();
  const int cols = (1 << 28) + 1024;
  const auto c = static_cast<std::size_t>(cols);
  rig r("cuda");
  const float* x = r.alloc<float>(c);  // one row of zeros: mean 0, rstd 1, every gradient 0
  const float* gamma = r.alloc<float>(c);
  const float* dy = r.alloc<float>(c);
  float* dx = r.alloc<float>(c);
  const float* mean = r.up(std::vector<float>{0.0f});
  const float* rstd = r.up(std::vector<float>{1.0f});
  float* dgamma = r.alloc<float>(c);
  float* dbeta = r.alloc<float>(c);
  r.dev().memset_async(dgamma, 0xff, c * sizeof(float), r.s());
  r.dev().memset_async(dbeta, 0xff, c * sizeof(float), r.s());
  layer_norm_backward(r.ctx(), r.s(), x, gamma, mean, rstd, dy, dx, dgamma, dbeta, 1, cols, false);
  EXPECT_EQ(r.down(dgamma + c - 4096, 4096), std::vector<float>(4096, 0.0f));
  EXPECT_EQ(r.down(dbeta + c - 4096, 4096), std::vector<float>(4096, 0.0f));
}

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

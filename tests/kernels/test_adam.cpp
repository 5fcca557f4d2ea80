// Adam: a hand-computed first step, two steps against a float64 replay of the formula, weight
// decay, argument checks, cuda against cpu.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_rig.hpp"
#include "kernels/adam.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

TEST(Adam, FirstStepByHand) {
  // Step 1 from zero moments: m = 0.1 g, v = 0.001 g^2, m_hat = g, v_hat = g^2,
  // so p -= lr * g / (|g| + eps).
  rig r;
  float* p = r.up(std::vector<float>{1.0f, -2.0f, 0.5f});
  const float* g = r.up(std::vector<float>{0.5f, -4.0f, 0.0f});
  float* m = r.alloc<float>(3);
  float* v = r.alloc<float>(3);
  adam_config c;
  c.lr = 0.1f;
  adam_step(r.ctx(), r.s(), p, g, m, v, 3, c, 1);
  const auto pv = r.down(p, 3);
  EXPECT_NEAR(pv[0], 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-6);
  EXPECT_NEAR(pv[1], -2.0 + 0.1 * 4.0 / (4.0 + 1e-8), 1e-6);
  EXPECT_EQ(pv[2], 0.5f);  // zero gradient: no move
  const auto mv = r.down(m, 3);
  const auto vv = r.down(v, 3);
  EXPECT_NEAR(mv[1], -0.4, 1e-6);
  EXPECT_NEAR(vv[1], 0.016, 1e-6);
}

TEST(Adam, TwoStepsWithWeightDecayMatchFloat64) {
  const std::size_t n = 20000;
  const auto p0 = random_floats(n, 1);
  const auto g1 = random_floats(n, 2);
  const auto g2 = random_floats(n, 3);
  adam_config c;
  c.lr = 0.01f;
  c.beta1 = 0.8f;
  c.beta2 = 0.99f;
  c.eps = 1e-6f;
  c.weight_decay = 0.1f;
  rig r;
  float* p = r.up(p0);
  float* m = r.alloc<float>(n);
  float* v = r.alloc<float>(n);
  adam_step(r.ctx(), r.s(), p, r.up(g1), m, v, n, c, 1);
  adam_step(r.ctx(), r.s(), p, r.up(g2), m, v, n, c, 2);
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    double pp = p0[i], mm = 0, vv = 0;
    for (int t = 1; t <= 2; ++t) {
      const double g = t == 1 ? g1[i] : g2[i];
      mm = 0.8 * mm + 0.2 * g;
      vv = 0.99 * vv + 0.01 * g * g;
      const double mh = mm / (1 - std::pow(0.8, t));
      const double vh = vv / (1 - std::pow(0.99, t));
      pp -= 0.01 * (mh / (std::sqrt(vh) + 1e-6) + 0.1 * pp);
    }
    want[i] = pp;
  }
  expect_near_all(r.down(p, n), want, 1e-5, 1e-5);
}

TEST(Adam, RejectsStepZeroAndBadBetas) {
  rig r;
  float* d = r.alloc<float>(4);
  EXPECT_THROW(adam_step(r.ctx(), r.s(), d, d, d, d, 4, adam_config{}, 0), spillway::usage_error);
  adam_config bad;
  bad.beta2 = 1.0f;
  EXPECT_THROW(adam_step(r.ctx(), r.s(), d, d, d, d, 4, bad, 1), spillway::usage_error);
}

TEST(AdamCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const std::size_t n = 100003;
  const auto p0 = random_floats(n, 4);
  const auto g = random_floats(n, 5);
  auto run = [&](rig& r) {
    float* p = r.up(p0);
    float* m = r.alloc<float>(n);
    float* v = r.alloc<float>(n);
    const float* dg = r.up(g);
    for (int t = 1; t <= 3; ++t) adam_step(r.ctx(), r.s(), p, dg, m, v, n, adam_config{}, t);
    return r.down(p, n);
  };
  rig cpu("cpu"), gpu("cuda");
  expect_near_all(run(gpu), run(cpu), 1e-6, 1e-5);
}

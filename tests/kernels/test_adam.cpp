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

namespace {

std::vector<bf16> to_bf16_all(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = to_bf16(x[i]);
  return out;
}

std::vector<float> widen_all(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}

struct mixed_state {
  std::vector<float> master, m, v;
  std::vector<bf16> weights;
};

// Three mixed-precision steps from master p0 with bf16 gradients g (the same each step).
mixed_state run_mixed(rig& r, const std::vector<float>& p0, const std::vector<bf16>& g, const adam_config& c) {
  const std::size_t n = p0.size();
  float* p = r.up(p0);
  float* m = r.alloc<float>(n);
  float* v = r.alloc<float>(n);
  bf16* w = r.alloc<bf16>(n);
  const bf16* dg = r.up(g);
  for (int t = 1; t <= 3; ++t) adam_step(r.ctx(), r.s(), p, dg, m, v, w, n, c, t);
  return {r.down(p, n), r.down(m, n), r.down(v, n), r.down(w, n)};
}

}  // namespace

TEST(AdamMixed, MasterEqualsFloat32StepOnWidenedGradientAndWeightsAreItsRounding) {
  const std::size_t n = 40001;  // not a multiple of any vector width
  const auto p0 = random_floats(n, 7);
  const auto g = to_bf16_all(random_floats(n, 8));
  adam_config c;
  c.lr = 0.01f;
  c.weight_decay = 0.1f;
  rig r;
  const mixed_state got = run_mixed(r, p0, g, c);

  float* p = r.up(p0);
  float* m = r.alloc<float>(n);
  float* v = r.alloc<float>(n);
  const float* dg = r.up(widen_all(g));
  for (int t = 1; t <= 3; ++t) adam_step(r.ctx(), r.s(), p, dg, m, v, n, c, t);
  const auto want_p = r.down(p, n);
  const auto want_m = r.down(m, n);
  const auto want_v = r.down(v, n);
  std::size_t moved = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(float_to_bits(got.master[i]), float_to_bits(want_p[i])) << "master at " << i;
    ASSERT_EQ(float_to_bits(got.m[i]), float_to_bits(want_m[i])) << "m at " << i;
    ASSERT_EQ(float_to_bits(got.v[i]), float_to_bits(want_v[i])) << "v at " << i;
    ASSERT_EQ(got.weights[i].bits, to_bf16(want_p[i]).bits) << "weights at " << i;
    if (got.master[i] != p0[i]) ++moved;
  }
  EXPECT_GT(moved, n / 2);  // the steps really moved the weights
}

TEST(AdamMixed, RejectsStepZero) {
  rig r;
  float* d = r.alloc<float>(4);
  bf16* h = r.alloc<bf16>(4);
  EXPECT_THROW(adam_step(r.ctx(), r.s(), d, h, d, d, h, 4, adam_config{}, 0), spillway::usage_error);
}

TEST(AdamMixedCuda, EqualsCpuBitForBit) {
  SPILLWAY_NEEDS_CUDA();
  const std::size_t n = 100003;
  const auto p0 = random_floats(n, 9);
  const auto g = to_bf16_all(random_floats(n, 10));
  rig cpu("cpu"), gpu("cuda");
  const mixed_state a = run_mixed(cpu, p0, g, adam_config{});
  const mixed_state b = run_mixed(gpu, p0, g, adam_config{});
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(float_to_bits(a.master[i]), float_to_bits(b.master[i])) << "master at " << i;
    ASSERT_EQ(a.weights[i].bits, b.weights[i].bits) << "weights at " << i;
  }
}

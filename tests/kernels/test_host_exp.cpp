// The cpu launchers' exponentials (Note [Host exponentials]): each value's bits depend on the
// value alone, they stay within a few ulp of e^x with IEEE's special cases, and GELU's chunked
// cpu launcher gives each element the bits of its per-element math.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernel_rig.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/host_exp.hpp"
#include "kernels/ops.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;
using spillway::kernels::detail::exp_in_place;
using spillway::kernels::detail::host_exp;

namespace {

std::vector<float> exp_inputs(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(static_cast<std::uint32_t>(spillway::test::test_seed(seed)));
  std::uniform_real_distribution<float> wide(-110.0f, 95.0f), narrow(-3.0f, 3.0f);
  const float specials[] = {0.0f,      -0.0f,     1.0f,      -1.0f,      88.72f,    88.73f,
                            -87.33f,   -103.97f,  -104.0f,   -150.0f,    1000.0f,   -1000.0f,
                            std::numeric_limits<float>::infinity(),     -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),    1e-30f,    -1e-40f};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto pick = g() % 8;
    v[i] = pick == 0 ? specials[g() % std::size(specials)] : pick < 4 ? wide(g) : narrow(g);
  }
  return v;
}

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

}  // namespace

TEST(HostExp, EachValueGetsItsOwnBitsWhateverItsNeighboursLengthAndPlace) {
  // Property: random slices of random arrays (lengths 1..41, any start, specials mixed in),
  // every element against host_exp of its value alone.
  std::mt19937 g(static_cast<std::uint32_t>(spillway::test::test_seed(7)));
  for (int round = 0; round < 400; ++round) {
    auto v = exp_inputs(64, static_cast<std::uint32_t>(round));
    const std::size_t start = g() % 20, len = 1 + g() % 41;
    const std::vector<float> before = v;
    exp_in_place(v.data() + start, len);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const bool inside = i >= start && i < start + len;
      const float want = inside ? host_exp(before[i]) : before[i];
      if (std::isnan(want))
        ASSERT_TRUE(std::isnan(v[i])) << "round " << round << " element " << i;
      else
        ASSERT_EQ(bits(v[i]), bits(want)) << "round " << round << " element " << i << " of x = " << before[i]
                                          << " (slice " << start << ".." << start + len << ")";
    }
  }
}

TEST(HostExp, IsWithinFourUlpOfTheExponentialWithIeeeSpecialCases) {
  const auto inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(host_exp(0.0f), 1.0f);
  EXPECT_EQ(host_exp(-0.0f), 1.0f);
  EXPECT_EQ(host_exp(inf), inf);
  EXPECT_EQ(host_exp(-inf), 0.0f);
  EXPECT_EQ(host_exp(1000.0f), inf);
  EXPECT_EQ(host_exp(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(host_exp(std::numeric_limits<float>::quiet_NaN())));
  // Normal results: within 4 ulp of e^x in float64 (the error glibc documents for libmvec).
  const float lo = -87.3f, hi = 88.7f;
  const int steps = 200000;
  for (int k = 0; k <= steps; ++k) {
    const float x = lo + (hi - lo) * static_cast<float>(k) / static_cast<float>(steps);
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    ASSERT_LE(std::abs(static_cast<double>(host_exp(x)) - want), 4 * ulp) << "x = " << x;
  }
  // Results in the denormal range keep their value to a denormal's step (no flush to zero).
  const float tiny = host_exp(-100.0f);
  EXPECT_GT(tiny, 0.0f);
  EXPECT_NEAR(tiny, std::exp(-100.0), 4 * std::numeric_limits<float>::denorm_min());
}

TEST(HostExp, GeluOnTheCpuGivesEachElementTheBitsOfItsOwnMath) {
  // The cpu launcher takes a chunk's exponentials at once; every element, at sizes that end
  // inside a chunk and inside a group of four, equals gelu_of / gelu_grad_of with host_exp.
  for (std::size_t n : {1u, 3u, 255u, 257u, 70001u}) {
    const auto x = random_floats(n, static_cast<std::uint32_t>(n), -6.0f, 6.0f);
    const auto dy = random_floats(n, static_cast<std::uint32_t>(n + 1));
    rig r;
    const float* dx = r.up(x);
    float* y = r.alloc<float>(n);
    gelu_forward(r.ctx(), r.s(), dx, y, n);
    const auto fwd = r.down(y, n);
    float* g = r.up(dy);
    gelu_backward(r.ctx(), r.s(), dx, g, g, n);
    const auto bwd = r.down(g, n);
    for (std::size_t i = 0; i < n; ++i) {
      const float e = host_exp(ops::gelu_exp_arg(x[i]));
      ASSERT_EQ(bits(fwd[i]), bits(ops::gelu_of(x[i], e))) << "n " << n << " element " << i;
      ASSERT_EQ(bits(bwd[i]), bits(dy[i] * ops::gelu_grad_of(x[i], e))) << "n " << n << " element " << i;
    }
  }
}

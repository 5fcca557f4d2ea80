// bf16 conversions and the bf16 elementwise kernels. to_bf16 against a reference that rounds by
// comparing distances in long double (not by the bit trick it checks): every bf16 value, every
// rounding boundary around each of them, denormals, the overflow edge, infinities and NaN. The
// conversion kernels equal the scalar functions; each bf16 elementwise kernel is to_bf16 of its
// float32 kernel on the widened inputs; cuda against cpu where a GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bf16_rig.hpp"
#include "kernels/elementwise.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

float from_bits(std::uint32_t u) { return bits_to_float(u); }

/// The value of a non-NaN bf16 pattern, with 0x7f80 / 0xff80 read as +-2^128 (where the next
/// binade would start) so that the overflow edge is one more rounding boundary.
long double value_unbounded(std::uint16_t h) {
  const bool neg = (h & 0x8000u) != 0;
  const std::uint16_t mag = h & 0x7fffu;
  long double v;
  if (mag == 0x7f80u)
    v = std::ldexp(1.0L, 128);
  else
    v = static_cast<long double>(from_bits(static_cast<std::uint32_t>(mag) << 16));
  return neg ? -v : v;
}

/// Round to nearest, ties to even, by distance: the two bf16 values around x (x's top 16 bits,
/// truncated, and the next one away from zero), the nearer one, on a tie the even one. Values
/// at or past the overflow edge round to infinity. Infinities pass; NaN becomes the quiet NaN
/// with x's sign and top payload bits.
std::uint16_t reference_to_bf16(float x) {
  const std::uint32_t u = float_to_bits(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  if (std::isinf(x)) return static_cast<std::uint16_t>(u >> 16);
  const auto down = static_cast<std::uint16_t>(u >> 16);
  const auto up = static_cast<std::uint16_t>(down + 1);  // next magnitude, same sign
  const long double xv = x;
  const long double d_down = std::fabs(xv - value_unbounded(down));
  const long double d_up = std::fabs(value_unbounded(up) - xv);
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1u) == 0 ? down : up;
}

/// Every float32 pattern that is a rounding boundary or next to one: for each bf16 pattern h,
/// h itself, one float ulp above it, just below, at and just above the midpoint to the next,
/// and just below the next. NaN patterns are left to their own tests.
std::vector<float> boundary_floats() {
  std::vector<float> v;
  v.reserve(65536u * 6);
  for (std::uint32_t h = 0; h < 65536u; ++h) {
    for (const std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float x = from_bits((h << 16) | low);
      if (!std::isnan(x)) v.push_back(x);
    }
  }
  return v;
}

}  // namespace

TEST(Bf16Convert, EveryBf16ValueWidensExactlyAndNarrowsBackToItself) {
  int nan_count = 0;
  for (std::uint32_t h = 0; h < 65536u; ++h) {
    const bf16 b{static_cast<std::uint16_t>(h)};
    const float x = to_float(b);
    ASSERT_EQ(float_to_bits(x), h << 16) << h;  // widening appends 16 zero bits
    if (std::isnan(x)) {
      ++nan_count;
      ASSERT_EQ(to_bf16(x).bits, h | 0x0040u) << h;  // made quiet, sign and payload top kept
    } else {
      ASSERT_EQ(to_bf16(x).bits, h) << h;
    }
  }
  EXPECT_EQ(nan_count, 2 * 127);  // exponent all ones, any of 127 nonzero mantissas, two signs
}

TEST(Bf16Convert, EveryRoundingBoundaryMatchesTheDistanceReference) {
  const auto xs = boundary_floats();
  ASSERT_GT(xs.size(), 65536u * 5);
  for (const float x : xs) ASSERT_EQ(to_bf16(x).bits, reference_to_bf16(x)) << std::hexfloat << x;
}

TEST(Bf16Convert, RandomPatternsMatchTheDistanceReference) {
  std::mt19937 gen(static_cast<std::uint32_t>(spillway::test::test_seed(7)));
  for (int i = 0; i < 1 << 20; ++i) {
    const float x = from_bits(static_cast<std::uint32_t>(gen()));
    ASSERT_EQ(to_bf16(x).bits, reference_to_bf16(x)) << std::hexfloat << x;
  }
}

TEST(Bf16Convert, TiesGoToEvenBothWays) {
  // 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): down to the even one.
  EXPECT_EQ(to_bf16(from_bits(0x3f808000u)).bits, 0x3f80u);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 (odd) and 0x3f82 (even): up to the even one.
  EXPECT_EQ(to_bf16(from_bits(0x3f818000u)).bits, 0x3f82u);
  EXPECT_EQ(to_bf16(from_bits(0xbf818000u)).bits, 0xbf82u);  // the sign does not change the rule
  // Off the midpoint by one float ulp, the nearer side wins whatever its parity.
  EXPECT_EQ(to_bf16(from_bits(0x3f808001u)).bits, 0x3f81u);
  EXPECT_EQ(to_bf16(from_bits(0x3f817fffu)).bits, 0x3f81u);
  // Rounding up can carry into the exponent: just below 2 rounds to 2.
  EXPECT_EQ(to_bf16(from_bits(0x3fffffffu)).bits, 0x4000u);
}

TEST(Bf16Convert, DenormalsAreKeptOnBothSides) {
  // The smallest bf16 denormal widens to 2^-133, not zero.
  EXPECT_EQ(to_float(bf16{0x0001u}), std::ldexp(1.0f, -133));
  EXPECT_EQ(to_float(bf16{0x8001u}), -std::ldexp(1.0f, -133));
  // Float denormals round to bf16 denormals: half of 2^-133 is a tie (to even, zero); a hair
  // above it rounds up; 1.5 * 2^-133 is a tie between 0x0001 and 0x0002 (even).
  EXPECT_EQ(to_bf16(from_bits(0x00008000u)).bits, 0x0000u);
  EXPECT_EQ(to_bf16(from_bits(0x00008001u)).bits, 0x0001u);
  EXPECT_EQ(to_bf16(from_bits(0x00018000u)).bits, 0x0002u);
  EXPECT_EQ(to_bf16(from_bits(0x80008001u)).bits, 0x8001u);
  // The largest bf16 denormal, and rounding up from it into the smallest normal.
  EXPECT_EQ(to_bf16(from_bits(0x007f0000u)).bits, 0x007fu);
  EXPECT_EQ(to_bf16(from_bits(0x007fffffu)).bits, 0x0080u);
  EXPECT_EQ(to_bf16(std::ldexp(1.0f, -126)).bits, 0x0080u);
}

TEST(Bf16Convert, LargestFiniteOverflowEdgeAndInfinities) {
  const float largest = to_float(bf16{0x7f7fu});
  EXPECT_EQ(largest, std::ldexp(255.0f, 120));  // (2 - 2^-7) * 2^127
  EXPECT_EQ(to_bf16(largest).bits, 0x7f7fu);
  EXPECT_EQ(to_bf16(from_bits(0x7f7f7fffu)).bits, 0x7f7fu);  // just below the edge: stays finite
  EXPECT_EQ(to_bf16(from_bits(0x7f7f8000u)).bits, 0x7f80u);  // the edge, a tie from an odd value: infinity
  EXPECT_EQ(to_bf16(from_bits(0x7f7fffffu)).bits, 0x7f80u);  // FLT_MAX is past it
  EXPECT_EQ(to_bf16(from_bits(0xff7f8000u)).bits, 0xff80u);
  EXPECT_EQ(to_bf16(from_bits(0xff7f7fffu)).bits, 0xff7fu);
  EXPECT_EQ(to_bf16(HUGE_VALF).bits, 0x7f80u);
  EXPECT_EQ(to_bf16(-HUGE_VALF).bits, 0xff80u);
  EXPECT_EQ(to_float(bf16{0x7f80u}), HUGE_VALF);
  EXPECT_EQ(to_float(bf16{0xff80u}), -HUGE_VALF);
}

TEST(Bf16Convert, NaNStaysNaNQuietWithItsSign) {
  EXPECT_EQ(to_bf16(from_bits(0x7fc00000u)).bits, 0x7fc0u);  // the quiet NaN
  EXPECT_EQ(to_bf16(from_bits(0xffc00000u)).bits, 0xffc0u);
  // Signalling NaNs whose payload lies only in the dropped bits would truncate to infinity or
  // round into the sign; they become quiet NaNs of the same sign instead.
  EXPECT_EQ(to_bf16(from_bits(0x7f800001u)).bits, 0x7fc0u);
  EXPECT_EQ(to_bf16(from_bits(0xff80ffffu)).bits, 0xffc0u);
  EXPECT_EQ(to_bf16(from_bits(0x7fffffffu)).bits, 0x7fffu);
  EXPECT_EQ(to_bf16(from_bits(0x7fa00000u)).bits, 0x7fe0u);  // payload top kept, quiet bit set
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::signbit(to_float(to_bf16(-std::nanf("")))));
}

TEST(Bf16ConvertKernels, CpuEqualsTheScalarFunctionsBitForBit) {
  auto xs = boundary_floats();  // several parallel chunks
  for (const std::uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff80ffffu, 0x7fa00000u})
    xs.push_back(from_bits(u));
  const std::size_t n = xs.size();
  rig r;
  bf16* narrow = r.alloc<bf16>(n);
  convert(r.ctx(), r.s(), r.up(xs), narrow, n);
  const auto got = r.down(narrow, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i].bits, to_bf16(xs[i]).bits) << i;

  std::vector<bf16> all(65536);
  for (std::uint32_t h = 0; h < 65536u; ++h) all[h].bits = static_cast<std::uint16_t>(h);
  float* wide = r.alloc<float>(all.size());
  convert(r.ctx(), r.s(), r.up(all), wide, all.size());
  const auto w = r.down(wide, all.size());
  for (std::uint32_t h = 0; h < 65536u; ++h) ASSERT_EQ(float_to_bits(w[h]), h << 16) << h;
}

namespace {

/// Inputs for the elementwise kernels, in bf16, with signed zeros and denormals among them and,
/// with `extremes`, the largest values and infinities too (which make some outputs NaN).
std::vector<bf16> elementwise_inputs(std::size_t n, std::uint32_t seed, float lo, float hi, bool extremes) {
  auto v = random_bf16(n, seed, lo, hi);
  const std::uint16_t specials[] = {0x0000u, 0x8000u, 0x0001u, 0x8001u, 0x007fu, 0x7f7fu, 0xff7fu, 0x7f80u, 0xff80u};
  const std::size_t count = extremes ? 9 : 5;
  for (std::size_t i = 0; i < count && i * 97 < n; ++i) v[i * 97].bits = specials[i];
  return v;
}

/// The outputs of every elementwise kernel in storage type T, on the same bf16 inputs (widened
/// for T = float): gelu, gelu', relu, relu', add, scale, bias add, bias backward (accumulating).
template <class T>
std::vector<std::vector<T>> run_elementwise(rig& r, const std::vector<bf16>& x16, const std::vector<bf16>& dy16,
                                            const std::vector<bf16>& bias16, int rows, int cols) {
  auto as = [](const std::vector<bf16>& v) {
    if constexpr (std::is_same_v<T, bf16>)
      return v;
    else
      return widen_bf16(v);
  };
  const std::size_t n = x16.size();
  const T* x = r.up(as(x16));
  const T* dy = r.up(as(dy16));
  T* y = r.alloc<T>(n);
  std::vector<std::vector<T>> out;
  gelu_forward(r.ctx(), r.s(), x, y, n);
  out.push_back(r.down(y, n));
  gelu_backward(r.ctx(), r.s(), x, dy, y, n);
  out.push_back(r.down(y, n));
  relu_forward(r.ctx(), r.s(), x, y, n);
  out.push_back(r.down(y, n));
  relu_backward(r.ctx(), r.s(), x, dy, y, n);
  out.push_back(r.down(y, n));
  add(r.ctx(), r.s(), x, dy, y, n);
  out.push_back(r.down(y, n));
  scale(r.ctx(), r.s(), x, -0.37f, y, n);
  out.push_back(r.down(y, n));
  T* yb = r.up(as(dy16));
  bias_add(r.ctx(), r.s(), yb, r.up(as(bias16)), rows, cols);
  out.push_back(r.down(yb, n));
  T* db = r.up(as(bias16));
  bias_backward(r.ctx(), r.s(), x, db, rows, cols, true);
  out.push_back(r.down(db, static_cast<std::size_t>(cols)));
  return out;
}

const char* const elementwise_names[] = {"gelu", "gelu'", "relu", "relu'", "add", "scale", "bias_add", "bias_backward"};

}  // namespace

TEST(Bf16Elementwise, EveryOutputIsTheRoundedFloat32Result) {
  const int rows = 70, cols = 300;  // several parallel chunks, columns past one bias pass
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const auto x = elementwise_inputs(n, 1, -5.0f, 5.0f, true);
  const auto dy = elementwise_inputs(n, 2, -1.0f, 1.0f, true);
  const auto bias = random_bf16(cols, 3);
  rig r;
  const auto got = run_elementwise<bf16>(r, x, dy, bias, rows, cols);
  const auto want = run_elementwise<float>(r, x, dy, bias, rows, cols);
  for (std::size_t i = 0; i < got.size(); ++i) expect_same_bits(got[i], round_bf16(want[i]), elementwise_names[i]);
}

TEST(Bf16Elementwise, InPlaceGivesTheSameBits) {
  const std::size_t n = 5000;
  const auto x = random_bf16(n, 4, -3.0f, 3.0f);
  const auto dy = random_bf16(n, 5);
  rig r;
  const bf16* dx = r.up(x);
  bf16* out = r.alloc<bf16>(n);
  gelu_forward(r.ctx(), r.s(), dx, out, n);
  const auto want = r.down(out, n);
  bf16* inplace = r.up(x);
  gelu_forward(r.ctx(), r.s(), inplace, inplace, n);
  expect_same_bits(r.down(inplace, n), want, "gelu in place");
  bf16* g = r.up(dy);
  gelu_backward(r.ctx(), r.s(), dx, g, out, n);
  const auto want_grad = r.down(out, n);
  gelu_backward(r.ctx(), r.s(), dx, g, g, n);
  expect_same_bits(r.down(g, n), want_grad, "gelu' in place over dy");
  bf16* a = r.up(x);
  add(r.ctx(), r.s(), a, r.up(dy), a, n);  // a gradient accumulated in place
  std::vector<bf16> sum(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = to_bf16(to_float(x[i]) + to_float(dy[i]));
  expect_same_bits(r.down(a, n), sum, "add in place");
}

TEST(Bf16ElementwiseCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const int rows = 33, cols = 257;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  // No infinities or near-overflow values: the NaNs they make have different bits on the host
  // and the device (x86's default NaN is negative, CUDA's positive), which is not a bf16 matter.
  const auto x = elementwise_inputs(n, 8, -4.0f, 4.0f, false);
  const auto dy = elementwise_inputs(n, 9, -1.0f, 1.0f, false);
  const auto bias = random_bf16(cols, 10);
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_elementwise<bf16>(cpu, x, dy, bias, rows, cols);
  const auto got = run_elementwise<bf16>(gpu, x, dy, bias, rows, cols);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (i < 2)  // gelu and gelu' take exponentials, whose host (libmvec) and device versions differ in the last bits
      expect_near_bf16(got[i], want[i], 1e-6, 1.0, elementwise_names[i]);
    else  // one correctly rounded float32 operation (or an in-order sum) and one rounding: the same bits
      expect_same_bits(got[i], want[i], elementwise_names[i]);
  }
  // Conversions: the same integer arithmetic on both sides.
  std::vector<bf16> all(65536);
  for (std::uint32_t h = 0; h < 65536u; ++h) all[h].bits = static_cast<std::uint16_t>(h);
  auto convert_both = [&](rig& r) {
    const std::size_t m = all.size();
    float* wide = r.alloc<float>(m);
    convert(r.ctx(), r.s(), r.up(all), wide, m);
    const auto xs = boundary_floats();
    bf16* narrow = r.alloc<bf16>(xs.size());
    convert(r.ctx(), r.s(), r.up(xs), narrow, xs.size());
    return std::pair{r.down(wide, m), r.down(narrow, xs.size())};
  };
  const auto [cpu_wide, cpu_narrow] = convert_both(cpu);
  const auto [gpu_wide, gpu_narrow] = convert_both(gpu);
  expect_same_bits(gpu_wide, cpu_wide, "widen");
  expect_same_bits(gpu_narrow, cpu_narrow, "narrow");
}

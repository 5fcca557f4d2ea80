// Global-norm clipping kernels: the sum of squares against float64 and against its documented
// order, bit for bit over runs, addresses and thread counts; the clip against float64, leaving
// gradients within the norm untouched; argument and workspace checks; cuda against cpu, bit for
// bit.
#include <gtest/gtest.h>

#include <tbb/global_control.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernel_rig.hpp"
#include "kernels/grad_norm.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

double sum_sq_ref(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return s;
}

/// Note [Sum of squares order] written out plainly: lanes, then the halving tree, per chunk;
/// then the same over the chunk results.
float lanes_then_tree(const std::vector<float>& v) {
  std::array<float, sum_of_squares_lanes> lane{};
  for (std::size_t i = 0; i < v.size(); ++i)
    lane[i % sum_of_squares_lanes] = exact::add(lane[i % sum_of_squares_lanes], v[i]);
  for (std::size_t half = sum_of_squares_lanes / 2; half > 0; half /= 2)
    for (std::size_t t = 0; t < half; ++t) lane[t] = exact::add(lane[t], lane[t + half]);
  return lane[0];
}

float documented_order(const std::vector<float>& x) {
  std::vector<float> partial;
  for (std::size_t first = 0; first < x.size(); first += sum_of_squares_chunk) {
    std::vector<float> sq;
    for (std::size_t i = first; i < x.size() && i < first + sum_of_squares_chunk; ++i) sq.push_back(exact::mul(x[i], x[i]));
    partial.push_back(lanes_then_tree(sq));
  }
  return lanes_then_tree(partial);
}

/// The sum of squares of x on r's device, x placed `offset` floats into its allocation.
float device_sum_sq(rig& r, const std::vector<float>& x, std::size_t offset = 0, float start = 0.0f,
                    bool accumulate = false) {
  float* sum = r.up(std::vector<float>{start});
  sum_of_squares(r.ctx(), r.s(), r.up(x, offset), x.size(), sum, accumulate);
  return r.down(sum, 1)[0];
}

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

const std::vector<std::size_t> sizes = {1, 255, 256, 257, 4095, 4096, 4097, 3 * 4096 + 17, (std::size_t{1} << 20) + 3};

}  // namespace

TEST(SumOfSquares, WorkspaceIsOneFloatPerChunkRoundedTo256Bytes) {
  EXPECT_EQ(sum_of_squares_workspace_bytes(0), 0u);
  EXPECT_EQ(sum_of_squares_workspace_bytes(1), 256u);
  EXPECT_EQ(sum_of_squares_workspace_bytes(64 * sum_of_squares_chunk), 256u);
  EXPECT_EQ(sum_of_squares_workspace_bytes(64 * sum_of_squares_chunk + 1), 512u);
  EXPECT_EQ(sum_of_squares_workspace_bytes(std::size_t{1} << 30), (std::size_t{1} << 30) / sum_of_squares_chunk * 4);
}

TEST(SumOfSquares, MatchesFloat64AndTheDocumentedOrderBitForBit) {
  rig r;
  for (std::size_t n : sizes) {
    const auto x = random_floats(n, static_cast<std::uint32_t>(n), -2.0f, 2.0f);
    const float got = device_sum_sq(r, x);
    const double want = sum_sq_ref(x);
    EXPECT_NEAR(got, want, 2e-6 * want) << "n = " << n;
    EXPECT_EQ(bits(got), bits(documented_order(x))) << "n = " << n;
  }
}

TEST(SumOfSquares, AccumulatesOverBuffersAndOverwritesWithoutAccumulate) {
  rig r;
  const auto a = random_floats(5000, 1), b = random_floats(70000, 2), c = random_floats(3, 3);
  float* sum = r.up(std::vector<float>{12345.0f});  // a stale value from the last step
  sum_of_squares(r.ctx(), r.s(), r.up(a), a.size(), sum, false);
  sum_of_squares(r.ctx(), r.s(), r.up(b), b.size(), sum, true);
  sum_of_squares(r.ctx(), r.s(), r.up(c), c.size(), sum, true);
  const float got = r.down(sum, 1)[0];
  const double want = sum_sq_ref(a) + sum_sq_ref(b) + sum_sq_ref(c);
  EXPECT_NEAR(got, want, 2e-6 * want);
  // The total is the buffers' sums added in call order, each in its fixed order.
  EXPECT_EQ(bits(got), bits(exact::add(exact::add(documented_order(a), documented_order(b)), documented_order(c))));
}

TEST(SumOfSquares, EmptyAndZeroBuffers) {
  rig r;
  EXPECT_EQ(bits(device_sum_sq(r, {}, 0, 7.0f, false)), bits(0.0f)) << "n = 0 without accumulate sets 0";
  EXPECT_EQ(device_sum_sq(r, {}, 0, 7.0f, true), 7.0f) << "n = 0 with accumulate adds nothing";
  EXPECT_EQ(bits(device_sum_sq(r, std::vector<float>(9000, 0.0f), 0, 7.0f, false)), bits(0.0f));
  EXPECT_EQ(bits(device_sum_sq(r, std::vector<float>(9000, -0.0f), 0, 7.0f, false)), bits(0.0f));
  // No workspace is needed for nothing.
  r.ctx().bind_workspace(nullptr, 0);
  float* sum = r.up(std::vector<float>{3.0f});
  sum_of_squares(r.ctx(), r.s(), static_cast<const float*>(nullptr), 0, sum, true);
  EXPECT_EQ(r.down(sum, 1)[0], 3.0f);
}

TEST(SumOfSquares, LargeValuesStayAccurateAndOverflowIsInfinite) {
  rig r;
  auto x = random_floats(20000, 4, -1e15f, 1e15f);  // squares near 1e30, the sum near 7e33
  const double want = sum_sq_ref(x);
  EXPECT_NEAR(device_sum_sq(r, x), want, 2e-6 * want);
  x[123] = 3e19f;  // its square alone is past the largest float
  const float inf = device_sum_sq(r, x);
  EXPECT_TRUE(std::isinf(inf) && inf > 0) << inf;
  EXPECT_EQ(clip_factor(inf, 1.0f), 0.0f);
}

TEST(SumOfSquares, SameBitsOverRunsAddressesAndThreadCounts) {
  rig r;
  const auto x = random_floats(3 * sum_of_squares_chunk * 17 + 5, 5, -3.0f, 3.0f);
  const float first = device_sum_sq(r, x);
  for (std::size_t offset : {0u, 1u, 3u, 17u, 64u, 1000u})
    for (int run = 0; run < 3; ++run)
      EXPECT_EQ(bits(device_sum_sq(r, x, offset)), bits(first)) << "offset " << offset << " run " << run;
  {
    const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    EXPECT_EQ(bits(device_sum_sq(r, x, 5)), bits(first)) << "on one thread";
  }
  // The order is not the plain serial one, so this test could tell them apart.
  float serial = 0;
  for (float v : x) serial += v * v;
  EXPECT_NE(bits(serial), bits(first));
}

TEST(SumOfSquares, RefusesBadArgumentsAndAMissingWorkspaceAtTheCall) {
  rig r;
  const auto x = random_floats(5 * sum_of_squares_chunk, 6);
  const float* dx = r.up(x);
  float* sum = r.alloc<float>(1);
  EXPECT_THROW(sum_of_squares(r.ctx(), r.s(), dx, x.size(), nullptr, false), usage_error);
  EXPECT_THROW(sum_of_squares(r.ctx(), r.s(), static_cast<const float*>(nullptr), x.size(), sum, false), usage_error);
  r.ctx().bind_workspace(nullptr, 0);
  try {
    sum_of_squares(r.ctx(), r.s(), dx, x.size(), sum, false);
    ADD_FAILURE() << "no error without a workspace";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("sum_of_squares needs a workspace of 256 bytes"), std::string::npos)
        << e.what();
  }
  // Bound at exactly the size the function gives, it runs.
  void* ws = r.dev().allocate(sum_of_squares_workspace_bytes(x.size()));
  r.ctx().bind_workspace(ws, sum_of_squares_workspace_bytes(x.size()));
  sum_of_squares(r.ctx(), r.s(), dx, x.size(), sum, false);
  EXPECT_NEAR(r.down(sum, 1)[0], sum_sq_ref(x), 2e-6 * sum_sq_ref(x));
  r.ctx().bind_workspace(nullptr, 0);
  r.dev().deallocate(ws, sum_of_squares_workspace_bytes(x.size()));
}

TEST(ClipFactor, IsMaxNormOverNormCappedAtOne) {
  EXPECT_EQ(clip_factor(0.0f, 1.0f), 1.0f);
  EXPECT_EQ(clip_factor(1.0f, 2.0f), 1.0f);
  EXPECT_FLOAT_EQ(clip_factor(16.0f, 1.0f), 1.0f / (4.0f + 1e-6f));
  EXPECT_FLOAT_EQ(clip_factor(100.0f, 5.0f), 0.5f);
  EXPECT_EQ(clip_factor(std::numeric_limits<float>::quiet_NaN(), 1.0f), 1.0f);
}

TEST(ClipByNorm, ScalesToTheMaxNormWhenAbove) {
  rig r;
  const auto g = random_floats(100003, 7);
  const double norm = std::sqrt(sum_sq_ref(g));
  const float max_norm = static_cast<float>(norm / 10);
  float* dg = r.up(g);
  float* sum = r.alloc<float>(1);
  sum_of_squares(r.ctx(), r.s(), dg, g.size(), sum, false);
  clip_by_norm(r.ctx(), r.s(), dg, g.size(), sum, max_norm);  // no synchronize between: stream order
  const auto got = r.down(dg, g.size());
  const double f = max_norm / (norm + 1e-6);
  std::vector<double> want(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) want[i] = g[i] * f;
  expect_near_all(got, want, 1e-9, 1e-5, "clipped");
  double clipped = 0;
  for (float v : got) clipped += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(clipped), max_norm, 1e-5 * max_norm);
}

TEST(ClipByNorm, LeavesGradientsWithinTheNormBitForBit) {
  rig r;
  auto g = random_floats(50000, 8);
  g[0] = -0.0f;
  g[1] = std::numeric_limits<float>::denorm_min();
  const float max_norm = static_cast<float>(std::sqrt(sum_sq_ref(g)) * 1.01);
  float* dg = r.up(g);
  float* sum = r.alloc<float>(1);
  sum_of_squares(r.ctx(), r.s(), dg, g.size(), sum, false);
  clip_by_norm(r.ctx(), r.s(), dg, g.size(), sum, max_norm);
  EXPECT_TRUE(same_bits(r.down(dg, g.size()), g));
}

TEST(ClipByNorm, ReadsTheSumWhenTheStreamGetsThereNotAtTheCall) {
  rig r;
  const auto g = random_floats(30000, 9);
  float* dg = r.up(g);
  float* sum = r.up(std::vector<float>{0.0f});  // at the call the sum says "no clipping"
  auto gate = r.hold_stream();
  sum_of_squares(r.ctx(), r.s(), dg, g.size(), sum, false);
  clip_by_norm(r.ctx(), r.s(), dg, g.size(), sum, 1.0f);
  gate.set_value();
  const auto got = r.down(dg, g.size());
  double norm = 0;
  for (float v : got) norm += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5);
}

TEST(ClipByNorm, RefusesAMaxNormThatIsNotPositiveAndFinite) {
  rig r;
  float* dg = r.up(random_floats(10, 10));
  float* sum = r.alloc<float>(1);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    try {
      clip_by_norm(r.ctx(), r.s(), dg, 10, sum, bad);
      ADD_FAILURE() << "no error for max_norm " << bad;
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("clip_by_norm"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(clip_by_norm(r.ctx(), r.s(), dg, 10, nullptr, 1.0f), usage_error);
  EXPECT_THROW(clip_by_norm(r.ctx(), r.s(), static_cast<float*>(nullptr), 10, sum, 1.0f), usage_error);
}

TEST(GradNormCuda, MatchesCpuAndRepeatsOverAddresses) {
  SPILLWAY_NEEDS_CUDA();
  rig cpu("cpu"), gpu("cuda");
  for (std::size_t n : sizes) {
    const auto x = random_floats(n, static_cast<std::uint32_t>(n) + 1, -2.0f, 2.0f);
    const float c = device_sum_sq(cpu, x);
    const float g = device_sum_sq(gpu, x);
    // The same steps in the same order, each rounded on its own: the same bits.
    EXPECT_EQ(bits(g), bits(c)) << "n = " << n << ": gpu " << g << ", cpu " << c;
    EXPECT_NEAR(g, sum_sq_ref(x), 2e-6 * sum_sq_ref(x)) << "n = " << n;
    for (std::size_t offset : {1u, 64u, 1000u})
      EXPECT_EQ(bits(device_sum_sq(gpu, x, offset)), bits(g)) << "n = " << n << " offset " << offset;
  }
  EXPECT_EQ(bits(device_sum_sq(gpu, {}, 0, 7.0f, false)), bits(0.0f));
  EXPECT_EQ(device_sum_sq(gpu, {}, 0, 7.0f, true), 7.0f);
  // The clip from the same sum: the factor is the shared body, so the bits agree.
  const auto gr = random_floats(100003, 11);
  auto clip = [&](rig& r, float max_norm) {
    float* dg = r.up(gr);
    float* sum = r.up(std::vector<float>{static_cast<float>(sum_sq_ref(gr))});
    clip_by_norm(r.ctx(), r.s(), dg, gr.size(), sum, max_norm);
    return r.down(dg, gr.size());
  };
  EXPECT_TRUE(same_bits(clip(gpu, 1.0f), clip(cpu, 1.0f)));
  EXPECT_TRUE(same_bits(clip(gpu, 1e9f), gr));
}

namespace {

std::vector<bf16> rounded(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = to_bf16(x[i]);
  return out;
}

std::vector<float> widened(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}

float device_sum_sq_bf16(rig& r, const std::vector<bf16>& x, std::size_t offset = 0) {
  float* sum = r.alloc<float>(1);
  sum_of_squares(r.ctx(), r.s(), r.up(x, offset), x.size(), sum, false);
  return r.down(sum, 1)[0];
}

// Clips bf16 gradients g by the norm max_norm, the sum of squares taken by the bf16 kernel.
std::vector<bf16> clip_bf16(rig& r, const std::vector<bf16>& g, float max_norm) {
  bf16* dg = r.up(g);
  float* sum = r.alloc<float>(1);
  sum_of_squares(r.ctx(), r.s(), dg, g.size(), sum, false);
  clip_by_norm(r.ctx(), r.s(), dg, g.size(), sum, max_norm);
  return r.down(dg, g.size());
}

}  // namespace

// bf16 gradients (mixed precision): each value is widened exactly, so the sum is the float32
// kernel's over the widened values, bit for bit, in the same order.
TEST(GradNormBf16, SumOfSquaresIsTheFloat32SumOfTheWidenedValues) {
  rig r;
  for (std::size_t n : sizes) {
    const auto x = rounded(random_floats(n, static_cast<std::uint32_t>(n) + 3, -2.0f, 2.0f));
    const float want = device_sum_sq(r, widened(x));
    EXPECT_EQ(bits(device_sum_sq_bf16(r, x)), bits(want)) << "n = " << n;
    EXPECT_EQ(bits(device_sum_sq_bf16(r, x, 5)), bits(want)) << "n = " << n << " at another address";
  }
}

TEST(GradNormBf16, ClipIsTheFloat32ClipRoundedAndLeavesSmallGradientsAlone) {
  rig r;
  const auto g = rounded(random_floats(50021, 13));
  const std::vector<float> wide = widened(g);
  const float max_norm = static_cast<float>(std::sqrt(sum_sq_ref(wide)) / 4);
  const auto got = clip_bf16(r, g, max_norm);
  float* dg = r.up(wide);
  float* sum = r.alloc<float>(1);
  sum_of_squares(r.ctx(), r.s(), dg, wide.size(), sum, false);
  clip_by_norm(r.ctx(), r.s(), dg, wide.size(), sum, max_norm);
  const auto want = r.down(dg, wide.size());
  std::size_t changed = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(got[i].bits, to_bf16(want[i]).bits) << "at " << i;
    if (got[i].bits != g[i].bits) ++changed;
  }
  EXPECT_GT(changed, g.size() / 2);
  const auto kept = clip_bf16(r, g, 1e9f);
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(kept[i].bits, g[i].bits) << "at " << i;
}

TEST(GradNormBf16Cuda, MatchesCpuBitForBit) {
  SPILLWAY_NEEDS_CUDA();
  rig cpu("cpu"), gpu("cuda");
  for (std::size_t n : sizes) {
    const auto x = rounded(random_floats(n, static_cast<std::uint32_t>(n) + 5, -2.0f, 2.0f));
    EXPECT_EQ(bits(device_sum_sq_bf16(gpu, x)), bits(device_sum_sq_bf16(cpu, x))) << "n = " << n;
  }
  const auto g = rounded(random_floats(100003, 17));
  const auto a = clip_bf16(cpu, g, 1.0f);
  const auto b = clip_bf16(gpu, g, 1.0f);
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(a[i].bits, b[i].bits) << "at " << i;
}

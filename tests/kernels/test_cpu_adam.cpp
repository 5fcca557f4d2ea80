// The CPU Adam: every body this CPU runs against adam_step on the cpu backend (and on the cuda
// backend where a GPU answers), bit for bit, on inputs full of denormals, infinities, NaNs and
// extremes; its argument checks and ISA queries; and numa_array (alignment, zeros, fallback).
#include <gtest/gtest.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_rig.hpp"
#include "kernels/adam.hpp"
#include "kernels/cpu_adam.hpp"
#include "kernels/numa_array.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

// A value for an Adam input: often a special one (zeros, denormals, infinities, NaN, the
// extremes), often a random denormal, otherwise a random float over most of the exponent range.
float wild_value(std::mt19937& gen) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  static const float specials[] = {0.0f,    -0.0f,   std::numeric_limits<float>::denorm_min(),
                                   -std::numeric_limits<float>::denorm_min(), FLT_MIN, -FLT_MIN,
                                   FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 1e-30f, -1e-30f, 1e-38f, inf, -inf,
                                   std::numeric_limits<float>::quiet_NaN(), 1.0f, -1.0f};
  std::uniform_int_distribution<int> pick(0, 99);
  const int kind = pick(gen);
  if (kind < 15) return specials[std::uniform_int_distribution<std::size_t>(0, std::size(specials) - 1)(gen)];
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7fffff);
  const std::uint32_t sign = (gen() & 1u) << 31;
  if (kind < 35) return std::bit_cast<float>(sign | std::max<std::uint32_t>(bits(gen), 1));  // a denormal
  if (kind < 60) {  // near the usual scale of weights and gradients
    return std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen);
  }
  const std::uint32_t exponent = std::uniform_int_distribution<std::uint32_t>(1, 254)(gen);
  return std::bit_cast<float>(sign | exponent << 23 | bits(gen));
}

std::vector<float> wild_values(std::size_t n, std::uint32_t seed, bool second_moment = false) {
  std::mt19937 gen(static_cast<std::uint32_t>(spillway::test::test_seed(seed)));
  std::vector<float> out(n);
  for (auto& x : out) {
    x = wild_value(gen);
    // A second moment is a sum of squares: mostly not negative, a few negatives to make NaNs.
    if (second_moment && std::uniform_int_distribution<int>(0, 49)(gen) != 0) x = std::fabs(x);
  }
  return out;
}

/// Equal bits for every value that is not NaN, and NaN exactly where `want` is NaN.
::testing::AssertionResult same_results(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  std::size_t misses = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isnan(want[i]) ? std::isnan(got[i])
                                        : std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i]);
    if (!ok && misses++ == 0) first = i;
  }
  if (misses == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << misses << " of " << got.size() << " differ; first at " << first << ": got " << got[first] << " (0x" << std::hex
     << std::bit_cast<std::uint32_t>(got[first]) << "), want " << std::dec << want[first] << " (0x" << std::hex
     << std::bit_cast<std::uint32_t>(want[first]) << ")";
  return ::testing::AssertionFailure() << os.str();
}

struct adam_case {
  std::size_t n;
  adam_config config;
  std::uint32_t seed;
  bool wild = true;  // special values, or plain values near the usual scale
};

/// Runs three steps (1, 2, then 1000) of cpu_adam_step with `isa` and of adam_step on `kind`
/// from the same start, and expects the same p, m and v after every step.
void expect_cpu_adam_matches(const std::string& kind, cpu_isa isa, const adam_case& k) {
  const std::size_t n = k.n;
  auto p = k.wild ? wild_values(n, k.seed) : random_floats(n, k.seed);
  auto m = k.wild ? wild_values(n, k.seed + 1) : std::vector<float>(n, 0.0f);
  auto v = k.wild ? wild_values(n, k.seed + 2, true) : std::vector<float>(n, 0.0f);
  rig r(kind);
  float* dp = r.up(p);
  float* dm = r.up(m);
  float* dv = r.up(v);
  const std::int64_t steps[] = {1, 2, 1000};
  for (std::size_t t = 0; t < std::size(steps); ++t) {
    const auto g = k.wild ? wild_values(n, k.seed + 10 + static_cast<std::uint32_t>(t))
                          : random_floats(n, k.seed + 10 + static_cast<std::uint32_t>(t));
    cpu_adam_step(p.data(), g.data(), m.data(), v.data(), n, k.config, steps[t], isa);
    adam_step(r.ctx(), r.s(), dp, r.up(g), dm, dv, n, k.config, steps[t]);
    const std::string where = kind + " backend, " + std::string(to_string(isa)) + ", n " + std::to_string(n) +
                              ", weight decay " + std::to_string(k.config.weight_decay) + ", step " +
                              std::to_string(steps[t]);
    EXPECT_TRUE(same_results(p, r.down(dp, n))) << "params, " << where;
    EXPECT_TRUE(same_results(m, r.down(dm, n))) << "m, " << where;
    EXPECT_TRUE(same_results(v, r.down(dv, n))) << "v, " << where;
  }
}

adam_config plain_adam() { return adam_config{}; }

adam_config adamw() {
  adam_config c;
  c.lr = 0.01f;
  c.beta1 = 0.8f;
  c.beta2 = 0.99f;
  c.eps = 1e-6f;
  c.weight_decay = 0.1f;
  return c;
}

// Lengths below, at and around both vector widths (8, 16), and over several host chunks with a
// tail, so the vector loop, the scalar tail and the chunk edges all meet the reference.
const std::size_t lengths[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, 3 * 16384 + 13};

void expect_isa_matches_cpu_backend(cpu_isa isa) {
  std::uint32_t seed = 100;
  for (std::size_t n : lengths)
    for (const adam_config& c : {plain_adam(), adamw()}) {
      expect_cpu_adam_matches("cpu", isa, {n, c, seed += 20});
      if (::testing::Test::HasFailure()) return;  // one failing case says enough
    }
}

class CpuAdamIsa : public ::testing::TestWithParam<cpu_isa> {};

}  // namespace

TEST(CpuAdam, IsaQueries) {
  EXPECT_TRUE(cpu_supports(cpu_isa::scalar));
  EXPECT_TRUE(cpu_supports(cpu_isa::best));
  const cpu_isa best = best_cpu_isa();
  EXPECT_NE(best, cpu_isa::best);
  EXPECT_TRUE(cpu_supports(best));
  if (cpu_supports(cpu_isa::avx512)) {
    EXPECT_EQ(best, cpu_isa::avx512);
  }
  for (cpu_isa isa : {cpu_isa::scalar, cpu_isa::avx2, cpu_isa::avx512, cpu_isa::best})
    EXPECT_EQ(parse_cpu_isa(to_string(isa)), isa);
  EXPECT_EQ(parse_cpu_isa("sse4"), std::nullopt);
  EXPECT_EQ(parse_cpu_isa("AVX2"), std::nullopt);
}

TEST_P(CpuAdamIsa, MatchesAdamStepOnTheCpuBackendBitForBit) {
  const cpu_isa isa = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " (the body compiles, it cannot run)";
  expect_isa_matches_cpu_backend(isa);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, CpuAdamIsa,
                         ::testing::Values(cpu_isa::scalar, cpu_isa::avx2, cpu_isa::avx512, cpu_isa::best),
                         [](const ::testing::TestParamInfo<cpu_isa>& info) { return std::string(to_string(info.param)); });

// Mixed precision: bf16 gradients (wild values rounded, so bf16 denormals, infinities and NaN
// too) and bf16 weights written from the fp32 master, against the mixed adam_step on the cpu
// backend: master and moments as above, the weights' bits equal (NaN where the device's is NaN).
TEST_P(CpuAdamIsa, MixedPrecisionMatchesAdamStepOnTheCpuBackend) {
  const cpu_isa isa = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " (the body compiles, it cannot run)";
  std::uint32_t seed = 700;
  for (std::size_t n : lengths) {
    for (const adam_config& c : {plain_adam(), adamw()}) {
      auto p = wild_values(n, seed += 20);
      auto m = wild_values(n, seed + 1);
      auto v = wild_values(n, seed + 2, true);
      std::vector<bf16> w(n, bf16{0});
      rig r("cpu");
      float* dp = r.up(p);
      float* dm = r.up(m);
      float* dv = r.up(v);
      bf16* dw = r.up(w);
      for (std::int64_t step : {1, 2, 1000}) {
        const auto wide = wild_values(n, seed + 10 + static_cast<std::uint32_t>(step));
        std::vector<bf16> g(n);
        for (std::size_t i = 0; i < n; ++i) g[i] = to_bf16(wide[i]);
        cpu_adam_step(p.data(), g.data(), m.data(), v.data(), w.data(), n, c, step, isa);
        adam_step(r.ctx(), r.s(), dp, r.up(g), dm, dv, dw, n, c, step);
        const std::string where = std::string(to_string(isa)) + ", n " + std::to_string(n) + ", step " + std::to_string(step);
        ASSERT_TRUE(same_results(p, r.down(dp, n))) << "master, " << where;
        ASSERT_TRUE(same_results(m, r.down(dm, n))) << "m, " << where;
        ASSERT_TRUE(same_results(v, r.down(dv, n))) << "v, " << where;
        const auto want = r.down(dw, n);
        for (std::size_t i = 0; i < n; ++i) {
          if (std::isnan(to_float(want[i])))
            ASSERT_TRUE(std::isnan(to_float(w[i]))) << "weights at " << i << ", " << where;
          else
            ASSERT_EQ(w[i].bits, want[i].bits) << "weights at " << i << ", " << where;
        }
      }
    }
  }
}

TEST(CpuAdam, PlainValuesOverManyChunksMatchAdamStep) {
  // Usual training values (moments from zero) over 16 host chunks and a tail: the parallel
  // partition gives the same bits as the device's.
  expect_cpu_adam_matches("cpu", cpu_isa::best, {16 * 16384 + 5, adamw(), 7, false});
}

TEST(CpuAdam, KeepsDenormals) {
  // Nothing in the process flushes denormals (MXCSR's flush-to-zero and denormals-are-zero bits
  // clear), and every body keeps them: with beta1 = 0.5 and g = 0, m = 2 denorm_min becomes
  // denorm_min, not 0; a denormal gradient's m is (1 - beta1) g, itself a denormal.
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_EQ(_mm_getcsr() & 0x8040u, 0u);
#endif
  constexpr float tiny = std::numeric_limits<float>::denorm_min();
  adam_config c;
  c.beta1 = 0.5f;
  for (cpu_isa isa : {cpu_isa::scalar, cpu_isa::avx2, cpu_isa::avx512}) {
    if (!cpu_supports(isa)) continue;
    const std::size_t n = 37;  // vector lanes and a scalar tail
    std::vector<float> p(n, 1.0f), g(n, 0.0f), m(n, 2 * tiny), v(n, 0.0f);
    g[n - 1] = 4 * tiny;
    m[n - 1] = 0.0f;
    cpu_adam_step(p.data(), g.data(), m.data(), v.data(), n, c, 1, isa);
    for (std::size_t i = 0; i + 1 < n; ++i) ASSERT_EQ(m[i], tiny) << to_string(isa) << " element " << i;
    EXPECT_EQ(m[n - 1], 2 * tiny) << to_string(isa);
  }
}

TEST(CpuAdam, RunsOnNumaArrays) {
  const std::size_t n = 5 * 16384 + 3;
  numa_array<float> p(n), g(n), m(n), v(n);
  const auto p0 = random_floats(n, 1), g0 = random_floats(n, 2);
  std::copy(p0.begin(), p0.end(), p.begin());
  std::copy(g0.begin(), g0.end(), g.begin());
  std::vector<float> pv = p0, mv(n, 0.0f), vv(n, 0.0f);
  for (std::int64_t t = 1; t <= 2; ++t) {
    cpu_adam_step(p.data(), g.data(), m.data(), v.data(), n, adamw(), t);
    cpu_adam_step(pv.data(), g0.data(), mv.data(), vv.data(), n, adamw(), t, cpu_isa::scalar);
  }
  EXPECT_TRUE(same_results({p.begin(), p.end()}, pv));
  EXPECT_TRUE(same_results({m.begin(), m.end()}, mv));
  EXPECT_TRUE(same_results({v.begin(), v.end()}, vv));
  EXPECT_NE(pv, p0);  // the steps moved the parameters
}

TEST(CpuAdam, RejectsBadArguments) {
  std::vector<float> d(4, 0.5f);
  float* x = d.data();
  EXPECT_THROW(cpu_adam_step(x, x, x, x, 4, adam_config{}, 0), spillway::usage_error);
  adam_config bad;
  bad.beta1 = 1.0f;
  EXPECT_THROW(cpu_adam_step(x, x, x, x, 4, bad, 1), spillway::usage_error);
  bad = adam_config{};
  bad.eps = -1.0f;
  EXPECT_THROW(cpu_adam_step(x, x, x, x, 4, bad, 1), spillway::usage_error);
  EXPECT_THROW(cpu_adam_step(x, nullptr, x, x, 4, adam_config{}, 1), spillway::usage_error);
  try {
    cpu_adam_step(x, x, x, x, 4, adam_config{}, 0);
  } catch (const spillway::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_adam_step: step counts from 1"), std::string::npos) << e.what();
  }
  // Zero elements: nothing to do, null buffers allowed.
  EXPECT_NO_THROW(cpu_adam_step(nullptr, nullptr, nullptr, nullptr, 0, adam_config{}, 1));
  if (!cpu_supports(cpu_isa::avx512)) {
    EXPECT_THROW(cpu_adam_step(x, x, x, x, 4, adam_config{}, 1, cpu_isa::avx512), spillway::usage_error);
  }
  EXPECT_EQ(d, std::vector<float>(4, 0.5f));  // refused calls wrote nothing
}

TEST(CpuAdamCuda, MatchesAdamStepOnTheCudaBackendBitForBit) {
  SPILLWAY_NEEDS_CUDA();
  std::uint32_t seed = 900;
  for (std::size_t n : lengths)
    for (const adam_config& c : {plain_adam(), adamw()}) expect_cpu_adam_matches("cuda", cpu_isa::best, {n, c, seed += 20});
  expect_cpu_adam_matches("cuda", cpu_isa::best, {16 * 16384 + 5, adamw(), 7, false});
}

// ---- numa_array ------------------------------------------------------------------------------

TEST(NumaArray, AlignedZeroedAndWritable) {
  for (int node : {numa_local_node, numa_no_node}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, 3 * kernels::detail::host_chunk + 7}) {
      numa_array<float> a(n, node);
      ASSERT_EQ(a.size(), n);
      ASSERT_NE(a.data(), nullptr);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % numa_array_alignment, 0u) << "node " << node;
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), 0u) << i;
      for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i);
      EXPECT_EQ(a[n - 1], static_cast<float>(n - 1));
      EXPECT_EQ(a.node(), node);
    }
  }
}

TEST(NumaArray, FallsBackToPlainMemoryWithoutNuma) {
  numa_array<float> plain(100, numa_no_node);
  EXPECT_FALSE(plain.numa_placed());
  numa_array<float> local(100);
  // Placed by libnuma wherever the kernel supports NUMA, plain aligned memory elsewhere.
  EXPECT_EQ(local.numa_placed(), numa_supported());
}

TEST(NumaArray, OnANamedNodeAndRefusingOnesThatAreNot) {
  numa_array<float> on0(4096, 0);  // node 0 exists wherever there is NUMA support
  EXPECT_EQ(on0[4095], 0.0f);
  EXPECT_THROW(numa_array<float>(16, -3), spillway::usage_error);
  if (numa_supported()) {
    EXPECT_THROW(numa_array<float>(16, 1 << 20), spillway::usage_error);
  }
}

TEST(NumaArray, MovesAndEmpties) {
  numa_array<float> a(10);
  a[3] = 3.0f;
  const float* data = a.data();
  numa_array<float> b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b[3], 3.0f);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): a moved-from array is empty
  EXPECT_EQ(a.data(), nullptr);
  numa_array<float> c;
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.size(), 10u);
  numa_array<float> none(0);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.data(), nullptr);
}

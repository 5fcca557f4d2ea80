// spillway-bench plan --fit-step-ms: op times from flops and bytes, fitted to a step time. On
// random traces against a reference: the times add up to the step, each is the roofline at the
// fitted rate, measured times are replaced; a step too short for the memory rate is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "bench/fit_times.hpp"
#include "device/error.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::bench;

namespace {

offload::hw_profile profile() {
  offload::hw_profile hw;
  hw.name = "test";
  hw.hbm_bytes_per_s = 2e12;
  return hw;
}

trace random_trace(std::mt19937_64& rng, std::size_t ops) {
  trace t;
  std::uniform_real_distribution<double> flops(0, 5e10);
  std::uniform_int_distribution<std::uint64_t> bytes(0, std::uint64_t{1} << 30);
  std::bernoulli_distribution none(0.2);
  for (std::size_t i = 0; i < ops; ++i) {
    op_desc o;
    o.name = "op" + std::to_string(i);
    o.flops = none(rng) ? 0 : flops(rng);
    o.bytes = none(rng) ? 0 : bytes(rng);
    o.measured_seconds = 3.0;  // set aside by the fit
    t.ops.push_back(o);
  }
  return t;
}

}  // namespace

TEST(FitOpTimes, RandomTracesAddUpToTheStepAtTheRooflineOfTheFittedRate) {
  std::mt19937_64 rng(spillway::test::test_seed(7));
  const auto hw = profile();
  for (int round = 0; round < 200; ++round) {
    trace t = random_trace(rng, 1 + rng() % 300);
    double floor_s = 0;
    for (const auto& o : t.ops) floor_s += std::max(o.bytes / hw.hbm_bytes_per_s, least_op_seconds);
    const double step_ms = floor_s * 1e3 * (1.0 + std::uniform_real_distribution<double>(0.01, 20)(rng));
    if (std::none_of(t.ops.begin(), t.ops.end(), [](const op_desc& o) { return o.flops > 0; })) {
      // No rate stretches ops without flops past the memory floor (a short trace, now and then).
      EXPECT_THROW((void)fit_op_times(t, hw, step_ms), config_error) << "round " << round;
      continue;
    }
    const double f = fit_op_times(t, hw, step_ms);
    double sum = 0;
    for (const auto& o : t.ops) {
      ASSERT_TRUE(o.measured_seconds.has_value());
      const double want = std::max({o.flops / f, o.bytes / hw.hbm_bytes_per_s, least_op_seconds});
      EXPECT_DOUBLE_EQ(*o.measured_seconds, want) << o.name;
      sum += *o.measured_seconds;
    }
    EXPECT_NEAR(sum * 1e3, step_ms, 1e-7 * step_ms) << "round " << round;
  }
}

TEST(FitOpTimes, ComputeBoundOpsKeepTheirFlopRatio) {
  trace t;
  for (double fl : {1e9, 4e9, 1e10}) {
    op_desc o;
    o.name = "op";
    o.flops = fl;
    t.ops.push_back(o);
  }
  const double f = fit_op_times(t, profile(), 15.0);
  EXPECT_NEAR(f, 1e12, 1e3);  // 1.5e10 flops in 15 ms
  EXPECT_NEAR(*t.ops[1].measured_seconds / *t.ops[0].measured_seconds, 4.0, 1e-9);
  EXPECT_NEAR(*t.ops[2].measured_seconds, 0.01, 1e-12);
}

TEST(FitOpTimes, AStepShorterThanTheMemoryRateAllowsIsRefused) {
  trace t;
  op_desc o;
  o.name = "copy-like";
  o.bytes = std::uint64_t{2} << 30;  // about 1.07 ms at 2 TB/s
  o.flops = 1e6;                     // some compute, so that a longer step is reachable
  t.ops.push_back(o);
  try {
    (void)fit_op_times(t, profile(), 1.0);
    FAIL() << "a 1 ms step was taken";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("shorter than"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)fit_op_times(t, profile(), 0.0), config_error);
  EXPECT_NO_THROW((void)fit_op_times(t, profile(), 1.2));
}

// A trace recorded without flop counts (Session::op's flops left at 0) has no time a compute
// rate can stretch: a step above its memory floor is refused, not met with times that add up
// to less (the fit had returned the floor's times for any longer step).
TEST(FitOpTimes, AStepLongerThanOpsWithoutFlopsCanTakeIsRefused) {
  trace t;
  for (std::uint64_t b : {std::uint64_t{1} << 30, std::uint64_t{0}}) {
    op_desc o;
    o.name = "no-flops";
    o.bytes = b;
    t.ops.push_back(o);
  }
  const double floor_ms = ((std::uint64_t{1} << 30) / 2e12 + least_op_seconds) * 1e3;
  try {
    (void)fit_op_times(t, profile(), 2 * floor_ms);
    FAIL() << "a step twice the memory floor was taken by ops without flops";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no op of the trace counts any flops"), std::string::npos) << msg;
    EXPECT_NE(msg.find("flops argument of Session::op"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW((void)fit_op_times(t, profile(), floor_ms));  // the floor itself is met exactly
  double sum = 0;
  for (const auto& o : t.ops) sum += *o.measured_seconds;
  EXPECT_NEAR(sum * 1e3, floor_ms, 1e-9 * floor_ms);
}

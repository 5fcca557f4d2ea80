// spillway-bench plan --fit-step-ms: op times from flops and bytes, fitted to a step time. On
// random traces against a reference: the times add up to the step, each is the roofline at the
// fitted rate, measured times are replaced; a step too short for the memory rate is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "bench/fit_times.hpp"
#include "device/error.hpp"

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
  std::mt19937_64 rng(7);
  const auto hw = profile();
  for (int round = 0; round < 200; ++round) {
    trace t = random_trace(rng, 1 + rng() % 300);
    double floor_s = 0;
    for (const auto& o : t.ops) floor_s += std::max(o.bytes / hw.hbm_bytes_per_s, least_op_seconds);
    const double step_ms = floor_s * 1e3 * (1.0 + std::uniform_real_distribution<double>(0.01, 20)(rng));
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

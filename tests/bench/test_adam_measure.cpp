// spillway-bench adam's measurement on a small size: both sides timed, the byte counts and the
// ratio consistent, bad options refused.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/adam_measure.hpp"
#include "device/error.hpp"

using namespace spillway;
using namespace spillway::bench;

TEST(AdamMeasure, MeasuresBothSidesOnASmallSize) {
  adam_measure_options o;
  o.elements = 3 * 16384 + 5;  // several host chunks and a tail
  o.repeats = 2;
  const adam_measure_result r = measure_adam_against_triad(o);
  EXPECT_EQ(r.elements, o.elements);
  EXPECT_EQ(r.repeats, 2);
  EXPECT_NE(r.isa, kernels::cpu_isa::best);
  EXPECT_EQ(r.isa, kernels::best_cpu_isa());
  EXPECT_GE(r.threads, 1);
  // The triad's 3 buffers hold the bytes Adam's 4 do, to within one element each.
  EXPECT_NEAR(12.0 * static_cast<double>(r.triad_elements), 16.0 * static_cast<double>(r.elements), 12.0);
  EXPECT_GT(r.adam_seconds, 0.0);
  EXPECT_LT(r.adam_seconds, 10.0);
  EXPECT_GT(r.triad_seconds, 0.0);
  EXPECT_LT(r.triad_seconds, 10.0);
  EXPECT_DOUBLE_EQ(r.adam_bytes_per_second(), 28.0 * static_cast<double>(r.elements) / r.adam_seconds);
  EXPECT_DOUBLE_EQ(r.ratio(), r.adam_bytes_per_second() / r.triad_bytes_per_second());
  EXPECT_TRUE(std::isfinite(r.ratio()));
}

TEST(AdamMeasure, RunsTheScalarBodyWhenAsked) {
  adam_measure_options o;
  o.elements = 1000;
  o.repeats = 1;
  o.isa = kernels::cpu_isa::scalar;
  EXPECT_EQ(measure_adam_against_triad(o).isa, kernels::cpu_isa::scalar);
}

TEST(AdamMeasure, RefusesNoElementsAndMissingIsas) {
  adam_measure_options o;
  o.elements = 0;
  EXPECT_THROW((void)measure_adam_against_triad(o), usage_error);
  o.elements = 100;
  o.repeats = 0;
  EXPECT_THROW((void)measure_adam_against_triad(o), usage_error);
  o.repeats = 1;
  if (!kernels::cpu_supports(kernels::cpu_isa::avx512)) {
    o.isa = kernels::cpu_isa::avx512;
    EXPECT_THROW((void)measure_adam_against_triad(o), usage_error);
  }
}

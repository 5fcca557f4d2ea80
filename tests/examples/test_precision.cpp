// The examples in bf16 mixed precision (Note [Mixed precision]) on the cpu backend: each example
// at its tiny size trains to the same losses, bit for bit, with every policy and with budgets of
// 1/2, 1/4 and the least any plan needs, as its bf16 run with everything resident; its loss
// falls as the fp32 run's does; the precision flag refuses what it does not know.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "device/error.hpp"
#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/report.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"
#include "example_runs.hpp"

namespace spillway::examples {
namespace {


constexpr int steps = testing::tiny_steps;

using testing::losses_text;

run_result run(const std::string& example, const example_options& o) { return testing::run_example(example, o); }

/// The tiny options in precision p.
example_options tiny_options(const std::string& policy, std::uint64_t budget, precision p) {
  example_options o = testing::tiny_options(policy, budget);
  o.prec = p;
  return o;
}

// The everything-resident run of each example in each precision, made once.
const run_result& resident(const std::string& example, precision p) {
  static std::map<std::pair<std::string, precision>, run_result> cache;
  const auto key = std::make_pair(example, p);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run(example, tiny_options("none", 0, p))).first;
  return it->second;
}

class bf16_invariant : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(bf16_invariant, losses_match_the_bf16_run_with_everything_resident) {
  const auto& [example, policy, budget_name] = GetParam();
  const run_result& base = resident(example, precision::bf16);
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(steps));
  std::uint64_t budget = base.min_budget_bytes;
  if (budget_name == "half") budget = base.footprint_bytes / 2;
  if (budget_name == "quarter") budget = base.footprint_bytes / 4;
  ASSERT_GE(budget, base.min_budget_bytes) << "the tiny model cannot test this budget";

  const run_result r = run(example, tiny_options(policy, budget, precision::bf16));
  EXPECT_EQ(r.footprint_bytes, base.footprint_bytes);
  ASSERT_EQ(r.losses.size(), base.losses.size());
  for (std::size_t i = 0; i < r.losses.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(r.losses[i]), std::bit_cast<std::uint32_t>(base.losses[i]))
        << example << " step " << i << ": " << losses_text(r) << "vs resident " << losses_text(base);
  EXPECT_LE(r.peak_device_bytes, budget) << "device memory in use went past the budget";
  EXPECT_GT(r.h2d_bytes + r.d2h_bytes + r.recomputes, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    examples, bf16_invariant,
    ::testing::Combine(::testing::Values("gpt", "mlp", "cnn"),
                       ::testing::Values("lms", "vdnn", "auto", "checkpoint", "capuchin"),
                       ::testing::Values("half", "quarter", "least")),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
    });

class bf16_training : public ::testing::TestWithParam<std::string> {};

// bf16 activations and gradients take half the bytes of fp32 ones; the master weights and the
// moments stay fp32, so the footprint shrinks, and the losses are bf16's own.
TEST_P(bf16_training, is_its_own_arithmetic_with_a_smaller_footprint) {
  const run_result& half = resident(GetParam(), precision::bf16);
  const run_result& full = resident(GetParam(), precision::fp32);
  EXPECT_EQ(half.parameters, full.parameters);
  EXPECT_LT(half.footprint_bytes, full.footprint_bytes);
  EXPECT_NE(losses_text(half), losses_text(full)) << "bf16 gave fp32's losses: nothing ran in bf16";
  for (float l : half.losses) EXPECT_TRUE(std::isfinite(l));
  // The first loss is the untrained model's, where bf16 rounding moves it by little.
  EXPECT_NEAR(half.losses.front(), full.losses.front(), 0.02 * std::abs(full.losses.front()));
}

// Over 30 steps the bf16 loss falls as the fp32 loss does: by at least 10%, and to within 5% of
// where fp32's ends (averages of the first and last five steps).
TEST_P(bf16_training, loss_falls_as_in_fp32) {
  auto mean5 = [](const run_result& r, bool last) {
    double sum = 0;
    for (std::size_t i = 0; i < 5; ++i) sum += r.losses[last ? r.losses.size() - 1 - i : i];
    return sum / 5;
  };
  auto o = tiny_options("auto", 0, precision::bf16);
  o.steps = 30;
  const run_result half = run(GetParam(), o);
  o.prec = precision::fp32;
  const run_result full = run(GetParam(), o);
  EXPECT_LT(mean5(half, true), 0.9 * mean5(half, false)) << losses_text(half);
  EXPECT_NEAR(mean5(half, true), mean5(full, true), 0.05 * mean5(full, true))
      << "bf16: " << losses_text(half) << "\nfp32: " << losses_text(full);
}

INSTANTIATE_TEST_SUITE_P(examples, bf16_training, ::testing::Values("gpt", "mlp", "cnn"));

// Global-norm clipping over bf16 gradients (the norm summed in fp32): it clips, and every policy
// gives the losses of the bf16 run with everything resident and the same clipping.
TEST_P(bf16_training, clipping_changes_the_losses_and_keeps_them_identical_across_policies) {
  auto o = tiny_options("none", 0, precision::bf16);
  o.clip_grad_norm = 0.05;
  const run_result clipped = run(GetParam(), o);
  const run_result& plain = resident(GetParam(), precision::bf16);
  ASSERT_EQ(clipped.losses.size(), plain.losses.size());
  EXPECT_NE(std::bit_cast<std::uint32_t>(clipped.losses[2]), std::bit_cast<std::uint32_t>(plain.losses[2]))
      << "clipping changed nothing: " << losses_text(clipped);
  for (const char* policy : {"lms", "auto"}) {
    o.policy = policy;
    o.device_budget = clipped.footprint_bytes / 2;
    EXPECT_EQ(losses_text(run(GetParam(), o)), losses_text(clipped)) << policy;
  }
}

TEST(precision_option, names_parse_and_unknown_ones_are_refused) {
  EXPECT_EQ(parse_precision("fp32"), precision::fp32);
  EXPECT_EQ(parse_precision("bf16"), precision::bf16);
  EXPECT_STREQ(to_string(precision::bf16), "bf16");
  try {
    (void)parse_precision("fp16");
    ADD_FAILURE() << "fp16 accepted";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'fp16'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace spillway::examples

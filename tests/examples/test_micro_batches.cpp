// Micro-batches in one process (--micro-batches N, Note [Micro-batches]): each example, in fp32
// and bf16, trains to the same losses, bit for bit, under every policy and budget as its
// micro-batched run with everything resident, and again on a second run; one micro-batch is the
// plain run; the flags refuse what does not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "device/error.hpp"
#include "examples/common/report.hpp"
#include "example_runs.hpp"

namespace spillway::examples {
namespace {

using testing::losses_text;

example_options options(const std::string& policy, std::uint64_t budget, precision p, int micro_batches) {
  example_options o = testing::tiny_options(policy, budget);
  o.prec = p;
  o.micro_batches = micro_batches;
  return o;
}

const run_result& resident(const std::string& example, precision p, int micro_batches) {
  static std::map<std::tuple<std::string, precision, int>, run_result> cache;
  const auto key = std::make_tuple(example, p, micro_batches);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, testing::run_example(example, options("none", 0, p, micro_batches))).first;
  return it->second;
}

class micro_batches : public ::testing::TestWithParam<std::tuple<std::string, std::string, int, precision>> {};

TEST_P(micro_batches, give_the_resident_micro_batched_losses) {
  const auto& [example, policy, share, prec] = GetParam();
  const run_result& base = resident(example, prec, 2);
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(testing::tiny_steps));
  const std::uint64_t budget = std::max(base.footprint_bytes / static_cast<std::uint64_t>(share), base.min_budget_bytes);
  const run_result r = testing::run_example(example, options(policy, budget, prec, 2));
  EXPECT_EQ(losses_text(r), losses_text(base)) << example << " " << policy << " 1/" << share;
  EXPECT_LE(r.peak_device_bytes, budget);
}

std::string name_of(const ::testing::TestParamInfo<micro_batches::ParamType>& info) {
  const auto& [example, policy, share, prec] = info.param;
  std::string p = policy;
  std::replace(p.begin(), p.end(), '-', '_');
  return example + "_" + p + "_1_" + std::to_string(share) + (prec == precision::bf16 ? "_bf16" : "_fp32");
}

INSTANTIATE_TEST_SUITE_P(examples, micro_batches,
                         ::testing::Combine(::testing::Values("gpt", "mlp", "cnn"),
                                            ::testing::Values("lms", "auto", "checkpoint"), ::testing::Values(2, 4),
                                            ::testing::Values(precision::fp32, precision::bf16)),
                         name_of);

TEST(micro_batches_runs, repeat_bit_for_bit_and_the_optimizer_may_run_on_the_host) {
  for (const char* example : {"gpt", "mlp", "cnn"}) {
    const run_result& base = resident(example, precision::fp32, 2);
    const run_result again = testing::run_example(example, options("none", 0, precision::fp32, 2));
    EXPECT_EQ(losses_text(again), losses_text(base)) << example;
    example_options o = options("auto", base.footprint_bytes / 4, precision::fp32, 2);
    o.host_ops = "host";
    const run_result on_host = testing::run_example(example, o);
    EXPECT_EQ(losses_text(on_host), losses_text(base)) << example;
    EXPECT_GT(on_host.host_ops, 0u) << example;
  }
}

TEST(micro_batches_runs, one_micro_batch_is_the_plain_run_and_more_learn_too) {
  for (const char* example : {"gpt", "mlp", "cnn"}) {
    const run_result plain = testing::run_example(example, testing::tiny_options("none", 0));
    EXPECT_EQ(losses_text(resident(example, precision::fp32, 1)), losses_text(plain)) << example;
    // Two micro-batches see the same data as one batch: the losses differ in their last bits only.
    const run_result& two = resident(example, precision::fp32, 2);
    ASSERT_EQ(two.losses.size(), plain.losses.size());
    for (std::size_t i = 0; i < plain.losses.size(); ++i)
      EXPECT_NEAR(two.losses[i], plain.losses[i], 1e-3 * std::max(1.0f, plain.losses[i])) << example << " step " << i;
  }
}

TEST(micro_batches_runs, refuse_what_does_not_fit) {
  example_options o = options("none", 0, precision::fp32, 3);
  try {
    (void)testing::run_example("mlp", o);
    FAIL() << "3 micro-batches of the tiny mlp's batch were accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("does not split into 3 micro-batches"), std::string::npos) << e.what();
  }
  o = options("none", 0, precision::fp32, 2);
  o.clip_grad_norm = 1.0;
  EXPECT_THROW(o.validate(), config_error);
  o = options("none", 0, precision::fp32, 2);
  o.data_parallel = true;
  EXPECT_THROW(o.validate(), config_error);
  o = options("none", 0, precision::fp32, 0);
  EXPECT_THROW(o.validate(), config_error);
  o = options("none", 0, precision::fp32, 1);
  o.zero = 3;
  EXPECT_THROW(o.validate(), config_error);
  o = options("none", 0, precision::fp32, 1);
  o.bucket_bytes = 1000;  // below 1 KiB
  try {
    o.validate();
    FAIL() << "a bucket below 1 KiB was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("--bucket-kib"), std::string::npos) << e.what();
  }
  o.bucket_bytes = 1024;
  EXPECT_NO_THROW(o.validate());
}

}  // namespace
}  // namespace spillway::examples

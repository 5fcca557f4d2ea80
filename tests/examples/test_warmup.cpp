// The examples' learning-rate warmup: losses fall steadily from the first step, with no early
// jump that a newcomer would read as corruption.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/parameters.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"

namespace spillway::examples {
namespace {

using literals::operator""_MiB;

TEST(warmup, the_rate_rises_linearly_to_its_full_value) {
  EXPECT_FLOAT_EQ(warmup_lr(1.0f, 1), 1.0f / static_cast<float>(warmup_steps));
  EXPECT_FLOAT_EQ(warmup_lr(1.0f, warmup_steps / 2), 0.5f);
  EXPECT_FLOAT_EQ(warmup_lr(2.0f, warmup_steps), 2.0f);
  EXPECT_FLOAT_EQ(warmup_lr(2.0f, warmup_steps + 100), 2.0f);
  for (std::int64_t s = 1; s < warmup_steps + 5; ++s) EXPECT_LE(warmup_lr(1.0f, s), warmup_lr(1.0f, s + 1));
}

class steady : public ::testing::TestWithParam<std::string> {};

// The measure asked for: in the first 20 steps no loss is more than 25% above the one before. At
// the tiny presets, which run in milliseconds; the small presets the demo trains take a minute
// each here and are measured with the programs themselves (--steps 20 --policy none).
// (That the loss falls is example_basics.training_lowers_the_loss in test_invariant.cpp.)
TEST_P(steady, no_loss_in_the_first_20_steps_is_a_quarter_above_the_one_before) {
  example_options o;
  o.backend = "cpu";
  o.cpu_device_memory = 256_MiB;
  o.policy = "none";
  o.steps = 20;
  o.seed = 1;
  o.size = preset::tiny;
  const run_result r = GetParam() == "gpt" ? run_gpt(o) : GetParam() == "mlp" ? run_mlp(o) : run_cnn(o);
  ASSERT_EQ(r.losses.size(), 20u);
  std::ostringstream all;
  for (float l : r.losses) all << l << ' ';
  for (std::size_t i = 1; i < r.losses.size(); ++i)
    EXPECT_LE(r.losses[i], 1.25f * r.losses[i - 1]) << "step " << i + 1 << "; losses: " << all.str();
}

INSTANTIATE_TEST_SUITE_P(examples, steady, ::testing::Values("gpt", "mlp", "cnn"));

// Where the jump was worst before the warmup: the small mlp's loss doubled at step 2 (3.05 to
// 6.24). Three steps of it, a few seconds.
TEST(steady_small, the_small_mlp_does_not_jump_at_its_first_steps) {
  example_options o;
  o.backend = "cpu";
  o.policy = "none";
  o.steps = 3;
  o.seed = 1;
  o.size = preset::small;
  const run_result r = run_mlp(o);
  ASSERT_EQ(r.losses.size(), 3u);
  for (std::size_t i = 1; i < r.losses.size(); ++i)
    EXPECT_LE(r.losses[i], 1.25f * r.losses[i - 1]) << "step " << i + 1 << ": " << r.losses[i - 1] << " -> " << r.losses[i];
}

}  // namespace
}  // namespace spillway::examples

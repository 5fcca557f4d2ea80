// The examples' invariant on the cpu backend: each example at its tiny size trains to the same
// losses, bit for bit, with every policy and with budgets of 1/2, 1/4 and the least any plan
// needs, as with everything resident; device memory in use stays within the budget.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "device/error.hpp"
#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/report.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"
#include "example_runs.hpp"

namespace spillway::examples {
namespace {

using literals::operator""_MiB;

using testing::losses_text;
using testing::tiny_options;
constexpr int steps = testing::tiny_steps;

using runner = std::function<run_result(const example_options&)>;

runner runner_for(const std::string& example) {
  return [example](const example_options& o) { return testing::run_example(example, o); };
}

// The everything-resident run of each example, made once.
const run_result& resident(const std::string& example) {
  static std::map<std::string, run_result> cache;
  auto it = cache.find(example);
  if (it == cache.end()) it = cache.emplace(example, runner_for(example)(tiny_options("none", 0))).first;
  return it->second;
}

class invariant : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(invariant, losses_match_everything_resident) {
  const auto& [example, policy, budget_name] = GetParam();
  const run_result& base = resident(example);
  ASSERT_EQ(base.losses.size(), static_cast<std::size_t>(steps));
  ASSERT_GT(base.footprint_bytes, 0u);
  ASSERT_GT(base.min_budget_bytes, 0u);
  ASSERT_LT(base.min_budget_bytes, base.footprint_bytes / 4) << "the tiny model cannot test a budget of 1/4";

  std::uint64_t budget = base.min_budget_bytes;
  if (budget_name == "half") budget = base.footprint_bytes / 2;
  if (budget_name == "quarter") budget = base.footprint_bytes / 4;

  const run_result r = runner_for(example)(tiny_options(policy, budget));
  EXPECT_EQ(r.device_budget_bytes, budget);
  EXPECT_EQ(r.footprint_bytes, base.footprint_bytes);
  ASSERT_EQ(r.losses.size(), base.losses.size());
  for (std::size_t i = 0; i < r.losses.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(r.losses[i]), std::bit_cast<std::uint32_t>(base.losses[i]))
        << example << " step " << i << ": " << losses_text(r) << "vs resident " << losses_text(base);
  EXPECT_LE(r.peak_device_bytes, budget) << "device memory in use went past the budget";
  // Where the budget leaves room to pack, a planner that keeps the budget is followed as planned:
  // nothing fetched or evicted on demand, no allocation refused for fragments (lms at 1/4 of
  // the mlp's footprint brought values back four ops ahead through ops with no room for them
  // and met 17 on-demand fetches: Note [Prefetches within the budget] in offload/plan_builder.cpp).
  // none keeps everything, and vdnn offloads only layer inputs: neither keeps such budgets.
  if (budget_name != "least" && policy != "none" && policy != "vdnn") {
    EXPECT_EQ(r.on_demand_fetches, 0u) << example << " " << policy << " " << budget_name;
    EXPECT_EQ(r.on_demand_evictions, 0u) << example << " " << policy << " " << budget_name;
    EXPECT_EQ(r.fragmented_allocations, 0u) << example << " " << policy << " " << budget_name;
  }
  // Below the footprint something has to leave the device and come back, or be made again.
  EXPECT_GT(r.h2d_bytes + r.d2h_bytes + r.recomputes, 0u);
  if (policy == "checkpoint" && budget_name == "half" && example != "mlp") {  // their forward ops are recomputable
    EXPECT_GT(r.recomputes, 0u) << "checkpoint reruns no forward op";
  }
}

INSTANTIATE_TEST_SUITE_P(
    examples, invariant,
    ::testing::Combine(::testing::Values("gpt", "mlp", "cnn"), ::testing::Values("none", "lms", "vdnn", "auto", "checkpoint", "capuchin"),
                       ::testing::Values("half", "quarter", "least")),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
    });

// The examples' forward ops keep the promise a recomputable op makes (Note [Checking reruns] in
// offload/session_rerun_check.cpp): with check_reruns on, every rerun of checkpoint at 1/2 and of
// auto at 1/4 of the footprint writes the bits of its first run, and the losses stay resident's.
TEST(examples_reruns, forward_bodies_pass_check_reruns) {
  for (const std::string example : {"gpt", "cnn"}) {
    const run_result& base = resident(example);
    const std::pair<std::string, std::uint64_t> runs[] = {{"checkpoint", base.footprint_bytes / 2},
                                                          {"auto", base.footprint_bytes / 4}};
    for (const auto& [policy, budget] : runs) {
      auto o = tiny_options(policy, budget);
      o.check_reruns = true;
      const run_result r = runner_for(example)(o);
      EXPECT_EQ(losses_text(r), losses_text(base)) << example << " " << policy;
      if (policy == "checkpoint") {
        EXPECT_GT(r.recomputes, 0u) << example << ": checkpoint reruns no forward op, nothing checked";
        // The summary and the --report file say how many reruns there were.
        EXPECT_EQ(report_json(r).at("recomputes").get<std::uint64_t>(), r.recomputes);
        EXPECT_NE(format_summary(r).find("reruns        " + std::to_string(r.recomputes) + " runs again"), std::string::npos)
            << format_summary(r);
      }
    }
  }
}

// auto weighs a rerun against a copy on the link the Session measured (Note [Recomputing
// planners] in offload/planner_recompute.cpp). At 1/4 of the tiny GPT's footprint a planned
// step copies about 0.33 MB each way beside about 2 ms of compute: over 100 GB/s that is a few
// microseconds, no rerun can shorten the step, and auto makes nothing again; over 10 MB/s it is
// over 30 ms each way, and auto makes values again instead of copying them (in one run: 20
// reruns, 0.21 MB brought back in place of 0.32). The losses are resident's either way.
TEST(examples_reruns, auto_makes_values_again_only_where_copies_cost_more) {
  const run_result& base = resident("gpt");
  for (const double gbps : {100.0, 0.01}) {
    auto o = tiny_options("auto", base.footprint_bytes / 4);
    o.link_gbps = gbps;
    const run_result r = runner_for("gpt")(o);
    EXPECT_EQ(losses_text(r), losses_text(base)) << gbps << " GB/s";
    EXPECT_GT(r.h2d_bytes + r.d2h_bytes + r.recomputes, 0u) << gbps << " GB/s: the budget tested nothing";
    if (gbps > 1)
      EXPECT_EQ(r.recomputes, 0u) << "auto reran ops over a link on which every copy hides";
    else
      EXPECT_GT(r.recomputes, 0u) << "auto copied everything over a link too slow for its copies to hide";
  }
}

class example_basics : public ::testing::TestWithParam<std::string> {};

TEST_P(example_basics, resident_run_is_sane) {
  const run_result& r = resident(GetParam());
  EXPECT_GT(r.parameters, 0u);
  EXPECT_EQ(r.backend, "cpu");
  for (float l : r.losses) EXPECT_TRUE(std::isfinite(l));
  // Before any learning the mean cross-entropy is near log(classes): between 0.5x and 2x of it
  // for every model here (gpt 256 byte tokens, mlp 8 classes, cnn 4 classes).
  const double classes = GetParam() == "gpt" ? 256 : GetParam() == "mlp" ? 8 : 4;
  EXPECT_GT(r.losses.front(), 0.5 * std::log(classes));
  EXPECT_LT(r.losses.front(), 2.0 * std::log(classes));
  EXPECT_LE(r.peak_device_bytes, r.device_budget_bytes);
  EXPECT_GE(r.footprint_bytes, r.min_budget_bytes);
}

TEST_P(example_basics, same_seed_same_losses_other_seed_other_losses) {
  const run_result& base = resident(GetParam());
  const run_result again = runner_for(GetParam())(tiny_options("none", 0));
  EXPECT_EQ(losses_text(again), losses_text(base));
  auto o = tiny_options("none", 0);
  o.seed = 8;
  const run_result other = runner_for(GetParam())(o);
  EXPECT_NE(losses_text(other), losses_text(base));
}

TEST_P(example_basics, training_lowers_the_loss) {
  auto o = tiny_options("auto", 0);
  o.steps = 30;
  const run_result r = runner_for(GetParam())(o);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += r.losses[static_cast<std::size_t>(i)];
    last += r.losses[r.losses.size() - 1 - static_cast<std::size_t>(i)];
  }
  EXPECT_LT(last, 0.9 * first) << losses_text(r);
}

// With a ratio the recording step runs at the whole device, then the Session's budget becomes the
// ratio of the footprint it learned; every later step is planned within it, and the losses are
// those of the everything-resident run.
TEST_P(example_basics, budget_ratio_is_a_fraction_of_the_footprint_from_the_second_step) {
  const run_result& base = resident(GetParam());
  auto o = tiny_options("auto", 0);
  o.budget_ratio = 0.5;
  const run_result r = runner_for(GetParam())(o);
  EXPECT_EQ(r.budget_ratio, 0.5);
  EXPECT_EQ(r.footprint_bytes, base.footprint_bytes);
  ASSERT_EQ(r.iterations.size(), static_cast<std::size_t>(steps));
  EXPECT_GT(r.iterations[0].peak_device_bytes, r.device_budget_bytes) << "the recording step ran under the ratio";
  // Step 2 records once more where its plan ran updates on the host: they move after the
  // backward pass for good (Note [Updates in the backward pass]), and the later plans keep them there.
  ASSERT_GE(r.iterations.size(), 3u);
  const std::size_t first_planned = r.iterations[1].planned ? 1 : 2;
  if (first_planned == 2) {
    EXPECT_GT(r.iterations[2].host_ops, 0u) << "step 2 recorded again, yet no update runs on the host";
  }
  for (std::size_t i = 1; i < r.iterations.size(); ++i) {
    if (i >= first_planned) {
      EXPECT_TRUE(r.iterations[i].planned) << "step " << i + 1;
    }
    EXPECT_LE(r.iterations[i].peak_device_bytes, r.device_budget_bytes) << "step " << i + 1;
  }
  EXPECT_EQ(r.device_budget_bytes, static_cast<std::uint64_t>(std::llround(0.5 * static_cast<double>(base.footprint_bytes))));
  EXPECT_EQ(losses_text(r), losses_text(base));
}

INSTANTIATE_TEST_SUITE_P(examples, example_basics, ::testing::Values("gpt", "mlp", "cnn"));

TEST(example_options, bad_values_are_config_errors_quoting_them) {
  auto expect_error = [](example_options o, const std::string& quoted) {
    try {
      o.validate();
      ADD_FAILURE() << "no error for " << quoted;
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find(quoted), std::string::npos) << e.what();
    }
  };
  auto o = tiny_options("auto", 0);
  o.policy = "lru";
  expect_error(o, "'lru'");
  o = tiny_options("auto", 0);
  o.backend = "tpu";
  expect_error(o, "'tpu'");
  o = tiny_options("auto", 0);
  o.steps = 0;
  expect_error(o, "--steps");
  o = tiny_options("auto", 1_MiB);
  o.budget_ratio = 0.5;
  expect_error(o, "--budget-ratio");
  EXPECT_THROW((void)parse_preset("huge"), config_error);
  EXPECT_EQ(parse_preset("tiny"), preset::tiny);
}

TEST(example_options, training_refuses_bad_options_before_any_work) {
  auto o = tiny_options("lru", 0);
  EXPECT_THROW((void)run_mlp(o), config_error);
}

// The footprint is known after the recording step, so that is where a ratio too small for it is
// refused, before any step runs under it.
TEST(example_options, a_ratio_below_the_least_budget_is_a_config_error_after_the_recording_step) {
  auto o = tiny_options("auto", 0);
  o.budget_ratio = 0.01;
  training_run run(o, [o] { return make_cnn(o); });
  const std::uint64_t whole = run.session().device_budget();
  try {
    run.step();
    ADD_FAILURE() << "no error for --budget-ratio 0.01";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--budget-ratio: 0.01"), std::string::npos) << msg;
    EXPECT_NE(msg.find("below the least any plan needs"), std::string::npos) << msg;
  }
  // The Session refuses the ratio as the recording step ends (device_budget_ratio): the step ran
  // and is in its history, but the trainer, whose step() threw, counts no step done.
  EXPECT_EQ(run.steps_done(), 0);
  EXPECT_EQ(run.session().history().size(), 1u);
  EXPECT_EQ(run.session().device_budget(), whole) << "the refused budget was set";
  EXPECT_THROW((void)run_cnn(o), config_error);
}

}  // namespace
}  // namespace spillway::examples

// How the examples use the device once training is under way, on the strict cpu backend: no
// step after the first makes a synchronous copy (batches are staged through pinned memory, the
// loss is read into pinned memory), frees device memory (a free synchronises the device), or
// runs compute as a host function.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "device/cpu_device.hpp"
#include "device/units.hpp"
#include "examples/cnn/cnn_model.hpp"
#include "examples/common/trainer.hpp"
#include "examples/gpt/gpt_model.hpp"
#include "examples/mlp/mlp_model.hpp"

namespace spillway::examples {
namespace {

using literals::operator""_MiB;

model_factory factory_for(const std::string& example, const example_options& o) {
  if (example == "gpt") return [o] { return make_gpt(o); };
  if (example == "mlp") return [o] { return make_mlp(o); };
  return [o] { return make_cnn(o); };
}

example_options tiny(const std::string& policy, double budget_ratio) {
  example_options o;
  o.backend = "cpu";
  o.cpu_device_memory = 64_MiB;
  o.policy = policy;
  o.budget_ratio = budget_ratio;
  o.steps = 4;
  o.seed = 7;
  o.size = preset::tiny;
  return o;
}

class device_use : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(device_use, steps_after_the_first_make_no_synchronous_copy) {
  const auto& [example, policy] = GetParam();
  // Everything resident without a budget, or the auto planner under half the footprint.
  const example_options o = tiny(policy, policy == "none" ? 0.0 : 0.5);
  training_run run(o, factory_for(example, o));
  run.step();  // the recording step: the staging buffer and the plan are made here
  run.step();  // the first planned step may still settle (allocator segments, layout)
  auto& dev = static_cast<cpu_device&>(run.session().device());
  const cpu_device_counters before = dev.counters();
  run.step();
  run.step();
  const cpu_device_counters after = dev.counters();
  EXPECT_EQ(after.synchronous_copies, before.synchronous_copies) << "copies from or to pageable host memory";
  EXPECT_EQ(after.synchronizing_frees, before.synchronizing_frees) << "device frees in the middle of training";
  EXPECT_GT(after.kernels, before.kernels);
  (void)run.finish();
}

INSTANTIATE_TEST_SUITE_P(examples, device_use,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "gpt"),
                                            ::testing::Values("none", "auto")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace spillway::examples

// The examples with their Adam steps on the host (host_ops = host, Note [Host-capable ops]) on
// the cpu backend: each example, in fp32 and in bf16, trains to the losses of its run with
// everything resident and the optimizer on the device, bit for bit, under lms, auto and
// zero-offload at 1/2 and 1/8 of the footprint (or the least budget, where that is more), and every planned step
// runs each Adam op on the host; with host_ops = device none does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "examples/common/report.hpp"
#include "example_runs.hpp"

namespace spillway::examples {
namespace {

using testing::losses_text;

example_options options(const std::string& policy, std::uint64_t budget, precision p, const std::string& host_ops) {
  example_options o = testing::tiny_options(policy, budget);
  o.prec = p;
  o.host_ops = host_ops;
  return o;
}

const run_result& resident(const std::string& example, precision p) {
  static std::map<std::pair<std::string, precision>, run_result> cache;
  const auto key = std::make_pair(example, p);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, testing::run_example(example, options("none", 0, p, "device"))).first;
  return it->second;
}

/// The Adam ops a step of the recorded trace has (the ops with a host implementation).
std::uint64_t adam_ops(const run_result& r) { return r.host_capable_ops; }

class host_adam : public ::testing::TestWithParam<std::tuple<std::string, std::string, int, precision>> {};

TEST_P(host_adam, gives_the_resident_losses_with_every_adam_step_on_the_host) {
  const auto& [example, policy, share, prec] = GetParam();
  const run_result& base = resident(example, prec);
  ASSERT_EQ(base.host_ops, 0u);
  const std::uint64_t budget = std::max(base.footprint_bytes / static_cast<std::uint64_t>(share), base.min_budget_bytes);
  const run_result r = testing::run_example(example, options(policy, budget, prec, "host"));
  EXPECT_EQ(losses_text(r), losses_text(base)) << example << " " << policy << " 1/" << share;
  // Every planned step ran every Adam op on the host.
  const std::uint64_t planned = static_cast<std::uint64_t>(r.losses.size()) - 1;
  EXPECT_EQ(r.host_ops, planned * adam_ops(r)) << example << " " << policy << " 1/" << share;
  EXPECT_GT(adam_ops(r), 0u);
  EXPECT_LE(r.peak_device_bytes, budget);
}

std::string name_of(const ::testing::TestParamInfo<host_adam::ParamType>& info) {
  const auto& [example, policy, share, prec] = info.param;
  std::string p = policy;
  std::replace(p.begin(), p.end(), '-', '_');
  return example + "_" + p + "_1_" + std::to_string(share) + (prec == precision::bf16 ? "_bf16" : "_fp32");
}

INSTANTIATE_TEST_SUITE_P(examples, host_adam,
                         ::testing::Combine(::testing::Values("gpt", "mlp", "cnn"),
                                            ::testing::Values("lms", "auto", "zero-offload"),
                                            ::testing::Values(2, 8),
                                            ::testing::Values(precision::fp32, precision::bf16)),
                         name_of);

TEST(host_adam_device, host_ops_device_keeps_every_step_on_the_device) {
  const run_result& base = resident("gpt", precision::fp32);
  const run_result r = testing::run_example("gpt", options("auto", base.footprint_bytes / 4, precision::fp32, "device"));
  EXPECT_EQ(r.host_ops, 0u);
  EXPECT_EQ(losses_text(r), losses_text(base));
}

}  // namespace
}  // namespace spillway::examples

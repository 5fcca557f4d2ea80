// The room a Session's plan leaves under the budget (Note [Headroom] in
// allocator/device_budget.hpp): the first plan is made for the whole budget less the most scratch
// one op held in the recorded iteration, where its packed layout fits there; a plan that still
// meets the run's scratch or packing short is made again with the margin's first step.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "allocator/device_budget.hpp"
#include "device/units.hpp"
#include "offload/session_config.hpp"
#include "offload/swap_policy.hpp"
#include "loop_config.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr std::uint64_t weight = 32_KiB;
constexpr int layers = 6;

// The loop tests' config (loop_config.hpp) with a budget in bytes.
session_config config(const std::string& policy, std::uint64_t budget) {
  session_config c = spillway::testing::config_for(policy, 0);
  c.device_budget = budget;
  return c;
}

// Six weights in a ring, each op adding one into the next with `scratch` bytes of workspace that
// its kernel fills and checks. Returns the iteration's report.
iteration_report step(Session& s, const std::vector<tensor_handle>& w, std::uint64_t scratch,
                      const std::shared_ptr<std::atomic<int>>& bad) {
  s.begin_iteration();
  for (int k = 0; k < layers; ++k) {
    const auto a = w[static_cast<std::size_t>(k)], b = w[static_cast<std::size_t>((k + 1) % layers)];
    auto op = s.op("layer" + std::to_string(k) + ".forward", {a, b}, {b});
    auto* p = static_cast<unsigned char*>(op.workspace(scratch));
    auto* pa = op.ptr<float>(a);
    auto* pb = op.ptr<float>(b);
    op.device().launch_kernel(op.stream(), [p, scratch, pa, pb, bad] {
      for (std::uint64_t i = 0; i < scratch; ++i) p[i] = static_cast<unsigned char>(i * 5);
      for (std::uint64_t i = 0; i < scratch; ++i)
        if (p[i] != static_cast<unsigned char>(i * 5)) ++*bad;
      for (std::uint64_t i = 0; i < weight / sizeof(float); ++i) pb[i] += pa[i];
    });
  }
  return s.end_iteration();
}

std::vector<tensor_handle> weights(Session& s) {
  std::vector<tensor_handle> w;
  const std::vector<float> one(weight / sizeof(float), 1.0f);
  for (int i = 0; i < layers; ++i)
    w.push_back(s.add_persistent("w" + std::to_string(i), weight, tensor_kind::parameter, one.data()));
  return w;
}

}  // namespace

// 144 KiB for 192 KiB of weights and 20 KiB of scratch per op: the plan for the budget less the
// scratch packs, so it is the plan, and the run follows it with nothing moved on demand.
TEST(SessionHeadroom, TheFirstPlanIsForTheWholeBudgetLessTheOpsScratch) {
  for (const char* policy : {"lms", "auto"}) {
    const std::uint64_t budget = 144_KiB, scratch = 20_KiB;
    Session s(config(policy, budget));
    const auto w = weights(s);
    auto bad = std::make_shared<std::atomic<int>>(0);
    const auto first = step(s, w, scratch, bad);
    EXPECT_FALSE(first.planned);
    EXPECT_EQ(first.op_scratch_peak_bytes, device_budget::placed(scratch)) << policy;
    ASSERT_NE(s.current_plan(), nullptr) << policy;
    EXPECT_EQ(s.current_plan()->budget_bytes, budget - device_budget::placed(scratch))
        << policy << ": not the plan for the whole budget less the scratch";
    for (int it = 0; it < 3; ++it) {
      const auto r = step(s, w, scratch, bad);
      EXPECT_TRUE(r.planned) << policy << " iteration " << it;
      EXPECT_EQ(r.on_demand_evictions + r.on_demand_fetches + r.fragmented_allocations, 0u) << policy << " iteration " << it;
      EXPECT_LE(r.peak_device_bytes, budget) << policy;
    }
    EXPECT_EQ(s.current_plan()->budget_bytes, budget - device_budget::placed(scratch)) << policy;
    EXPECT_EQ(bad->load(), 0) << policy;
    std::vector<float> out(weight / sizeof(float));
    s.read(w[0], out.data(), weight);
    EXPECT_GT(out[0], 1.0f) << policy << ": the weights never changed";
  }
}

// Ops that ask for more scratch once the plan is made than in the recorded iteration find no room
// above the plan's layout: tensors leave on demand, the values stay right, and the next plan is
// made under the margin's first step (1/32 of the budget).
TEST(SessionHeadroom, ScratchBeyondWhatWasRecordedWidensTheMargin) {
  const std::uint64_t budget = 100_KiB;  // three weights below the scratch recorded, 4 KiB
  Session s(config("lms", budget));
  const auto w = weights(s);
  auto bad = std::make_shared<std::atomic<int>>(0);
  (void)step(s, w, 4_KiB, bad);
  ASSERT_NE(s.current_plan(), nullptr);
  EXPECT_EQ(s.current_plan()->budget_bytes, budget - 4_KiB);
  const auto more = step(s, w, 24_KiB, bad);
  EXPECT_TRUE(more.planned);
  EXPECT_GT(more.on_demand_evictions, 0u) << "24 KiB of scratch fit above a layout planned for 4";
  EXPECT_EQ(more.op_scratch_peak_bytes, 24_KiB);
  EXPECT_LE(s.current_plan()->budget_bytes, device_budget(budget).planning_bytes(0));
  const auto after = step(s, w, 24_KiB, bad);
  EXPECT_LE(after.peak_device_bytes, budget);
  EXPECT_EQ(bad->load(), 0);
}

// One planner called from several threads at once makes the plan it makes alone
// (planner::make_plan keeps nothing between calls).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "offload/planner.hpp"
#include "recompute_test_support.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::offload;

namespace {

// Where `a` and `b` differ, the first difference; "" where they are the same plan.
std::string difference(const plan& a, const plan& b) {
  if (a.policy != b.policy) return "policy " + a.policy + " vs " + b.policy;
  if (a.budget_bytes != b.budget_bytes) return "budget";
  if (a.initial_tier != b.initial_tier) return "initial tiers";
  if (a.steps.size() != b.steps.size()) return "step count";
  for (std::size_t k = 0; k < a.steps.size(); ++k) {
    const auto& x = a.steps[k];
    const auto& y = b.steps[k];
    const std::string at = " at op " + std::to_string(k);
    if (x.prefetches.size() != y.prefetches.size()) return "prefetch count" + at;
    for (std::size_t i = 0; i < x.prefetches.size(); ++i)
      if (x.prefetches[i].tensor != y.prefetches[i].tensor || x.prefetches[i].from != y.prefetches[i].from ||
          x.prefetches[i].use != y.prefetches[i].use)
        return "prefetch" + at;
    if (x.recomputes != y.recomputes) return "recomputes" + at;
    if (x.evictions.size() != y.evictions.size()) return "eviction count" + at;
    for (std::size_t i = 0; i < x.evictions.size(); ++i)
      if (x.evictions[i].tensor != y.evictions[i].tensor || x.evictions[i].action != y.evictions[i].action)
        return "eviction" + at;
    if (x.on_host != y.on_host || x.synchronous != y.synchronous) return "placement" + at;
  }
  return "";
}

}  // namespace

TEST(PlannersThreads, FourThreadsAtOnceMakeThePlanEachMakesAlone) {
  std::mt19937_64 rng(spillway::test::test_seed(9191));
  const auto hw = recompute_testing::test_hw(2e9);
  for (int round = 0; round < 10; ++round) {
    const trace t = recompute_testing::random_training(rng);
    const auto r = analyze(t);
    const std::uint64_t budget = r.min_budget_bytes + (r.peak_live_bytes - r.min_budget_bytes) / 3;
    for (const auto& name : planner_names()) {
      SCOPED_TRACE(name + ", round " + std::to_string(round));
      const auto pl = make_planner(name);
      const plan alone = pl->make_plan(t, r, hw, budget);
      std::vector<plan> made(4);
      std::vector<std::thread> threads;
      for (std::size_t i = 0; i < made.size(); ++i)
        threads.emplace_back([&, i] { made[i] = pl->make_plan(t, r, hw, budget); });
      for (auto& th : threads) th.join();
      for (const auto& p : made) EXPECT_EQ(difference(alone, p), "");
    }
  }
}

// Planners called from several threads at once (fit_plan's search does: Note [A wider search]
// in offload/fit_plan.cpp) make the plan each makes alone, and fit_plan keeps the same plan
// whether its search runs one budget at a time or several at once.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "allocator/device_budget.hpp"
#include "offload/fit_plan.hpp"
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

// Random traces on a slow link and budgets near the least, until two plans were kept packed in
// the executor's order alone (fit_plan packs the plans that missed several at once, and may
// search a grid of budgets; one trace in 20 to 40 gets there).
TEST(PlannersThreads, FitPlanKeepsTheSamePlanOneBudgetAtATimeOrFourAtOnce) {
  std::mt19937_64 rng(spillway::test::test_seed(9292));
  const auto hw = recompute_testing::test_hw(2e8);
  const auto pl = make_planner("auto");
  int in_order = 0;
  for (int round = 0; round < 400 && in_order < 2; ++round) {
    const trace t = recompute_testing::random_training(rng);
    const auto r = analyze(t);
    const device_budget budget(r.min_budget_bytes + (r.peak_live_bytes - r.min_budget_bytes) / 8);
    SCOPED_TRACE("round " + std::to_string(round));
    auto fit = [&](int width) {
      tbb::task_arena arena(width);
      return arena.execute([&] { return fit_plan(*pl, t, r, hw, budget, device_budget::no_margin, {}); });
    };
    const auto one = fit(1);
    const auto four = fit(4);
    EXPECT_EQ(difference(one.p, four.p), "");
    EXPECT_EQ(one.fits, four.fits);
    EXPECT_EQ(one.waits_for_addresses, four.waits_for_addresses);
    EXPECT_EQ(one.predicted_seconds, four.predicted_seconds);
    EXPECT_EQ(one.layout.extent, four.layout.extent);
    in_order += one.waits_for_addresses;
  }
  EXPECT_EQ(in_order, 2) << "random traces seldom keep a plan packed in order alone";
}

// The optimal reference planner on traces small enough to solve by hand: it finds the step the
// hand analysis gives, by recomputing when the link is slow and by swapping when it is fast.
#include <stdexcept>
#include <gtest/gtest.h>

#include "bench/milp.hpp"
#include "bench/plan_optimal.hpp"
#include "offload/lifetime.hpp"
#include "offload/zoo.hpp"

namespace spillway::bench {
namespace {

constexpr std::uint64_t MB = 1000000;

offload::hw_profile profile(double link_bytes_per_s) {
  offload::hw_profile hw;
  hw.name = "test";
  hw.device_bytes = 1000 * MB;
  hw.compute_flops_per_s = 1e12;
  hw.hbm_bytes_per_s = 1e12;
  hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = link_bytes_per_s;
  hw.copy_engines = 2;
  hw.host_bytes = 1000000 * MB;
  hw.nvme_read_bytes_per_s = hw.nvme_write_bytes_per_s = 1e9;
  hw.nvme_bytes = 1000000 * MB;
  return hw;
}

// Seven ops of 1 ms. 'in' (1 MB, a metric: it never leaves) feeds the recomputable op f that
// writes 'a' (1 MB); 'a' is idle during ops 3 and 4 and read again by op 5. With a budget of
// 4 MB, op 3 needs in + b (2 MB) + c: 'a' must be off then. Swapping it: the copy out must end
// before op 3 (serial), the copy back overlaps op 4 (op 4 has room for it): 7 ms + one copy.
// Recomputing it: drop it after op 2 and rerun f before op 5: 8 ms.
trace hand_trace() {
  trace t;
  const auto in = t.add_tensor("in", MB, tensor_kind::metric);
  const auto a = t.add_tensor("a", MB, tensor_kind::activation);
  const auto b = t.add_tensor("b", 2 * MB, tensor_kind::activation);
  const auto c = t.add_tensor("c", MB, tensor_kind::activation);
  const auto d = t.add_tensor("d", MB, tensor_kind::activation);
  const auto e = t.add_tensor("e", MB, tensor_kind::activation);
  auto op = [&](std::string name, std::vector<tensor_id> r, std::vector<tensor_id> w, bool recomputable = false) {
    op_desc o;
    o.name = std::move(name);
    o.reads = std::move(r);
    o.writes = std::move(w);
    o.measured_seconds = 1e-3;
    o.recomputable = recomputable;
    t.add_op(std::move(o));
  };
  op("load", {}, {in});
  op("f", {in}, {a}, true);
  op("p", {a}, {b});
  op("q", {b}, {c});
  op("s", {c}, {d});
  op("u", {a, d}, {e});
  op("v", {in, e}, {});
  return t;
}

TEST(PlanOptimal, RecomputesWhenTheLinkIsSlow) {
  for (const auto& solver : milp_solvers()) {
    SCOPED_TRACE(solver);
    const auto t = hand_trace();
    const auto r = offload::analyze(t);
    const auto hw = profile(1e8);  // a 1 MB copy takes 10 ms, a rerun of f 1 ms
    std::string why;
    const auto res = plan_optimal(t, r, hw, 4 * MB, 10, &why, solver);
    ASSERT_TRUE(res) << why;
    EXPECT_TRUE(res->proven_optimal) << res->status;
    EXPECT_TRUE(res->sim.feasible()) << (res->sim.violations.empty() ? "" : res->sim.violations.front());
    EXPECT_NEAR(res->sim.step_seconds, 8e-3, 1e-9);
    EXPECT_NEAR(res->objective_s, 8e-3, 1e-7);
    EXPECT_EQ(res->sim.recomputes, 1u);
    EXPECT_EQ(res->sim.h2d_bytes, 0u);
    ASSERT_EQ(res->p.steps[5].recomputes.size(), 1u);
    EXPECT_EQ(res->p.steps[5].recomputes[0], 1u);
  }
}

TEST(PlanOptimal, SwapsWhenTheLinkIsFast) {
  for (const auto& solver : milp_solvers()) {
    SCOPED_TRACE(solver);
    const auto t = hand_trace();
    const auto r = offload::analyze(t);
    const auto hw = profile(1e10);  // a 1 MB copy takes 0.1 ms
    std::string why;
    const auto res = plan_optimal(t, r, hw, 4 * MB, 10, &why, solver);
    ASSERT_TRUE(res) << why;
    EXPECT_TRUE(res->proven_optimal) << res->status;
    EXPECT_TRUE(res->sim.feasible()) << (res->sim.violations.empty() ? "" : res->sim.violations.front());
    EXPECT_NEAR(res->sim.step_seconds, 7.1e-3, 1e-9);
    EXPECT_NEAR(res->objective_s, 7.1e-3, 1e-7);
    EXPECT_EQ(res->sim.recomputes, 0u);
    EXPECT_EQ(res->sim.d2h_bytes, MB);
    EXPECT_EQ(res->sim.h2d_bytes, MB);
  }
}

TEST(PlanOptimal, KeepsEverythingWhenItFits) {
  for (const auto& solver : milp_solvers()) {
    SCOPED_TRACE(solver);
    const auto t = hand_trace();
    const auto r = offload::analyze(t);
    const auto res = plan_optimal(t, r, profile(1e8), r.peak_live_bytes, 10, nullptr, solver);
    ASSERT_TRUE(res);
    EXPECT_TRUE(res->sim.feasible());
    EXPECT_NEAR(res->sim.step_seconds, 7e-3, 1e-9);
    EXPECT_EQ(res->p.prefetch_count() + res->p.recompute_count(), 0u);
  }
}

TEST(PlanOptimal, RefusesWhatItCannotTake) {
  const auto t = hand_trace();
  const auto r = offload::analyze(t);
  std::string why;
  EXPECT_FALSE(plan_optimal(t, r, profile(1e8), r.min_budget_bytes - 1, 10, &why));
  EXPECT_NE(why.find("budget"), std::string::npos) << why;
  const auto big = offload::make_model_trace("gpt2-small", {1, 64, 16});
  ASSERT_GT(big.ops.size(), optimal_max_ops);
  EXPECT_FALSE(plan_optimal(big, offload::analyze(big), profile(1e8), 1ull << 40, 10, &why));
  EXPECT_NE(why.find("ops"), std::string::npos) << why;
}

// Every solver the build has is asked in the tests above; one it lacks is refused by name.
TEST(PlanOptimal, NamesTheSolversItHas) {
  const auto have = milp_solvers();
  ASSERT_FALSE(have.empty());
  const auto t = hand_trace();
  const auto r = offload::analyze(t);
  try {
    (void)plan_optimal(t, r, profile(1e8), 4 * MB, 10, nullptr, "simplex-by-hand");
    FAIL() << "an unknown solver was taken";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("simplex-by-hand"), std::string::npos) << what;
    for (const auto& s : have) EXPECT_NE(what.find(s), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace spillway::bench

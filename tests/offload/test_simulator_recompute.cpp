// Tests of recomputation in plans and in the simulator (Note [Recomputation] in
// prefetch/plan.hpp): timelines worked out by hand (1 s ops), chains, and the rules a rerun
// must keep.
#include <gtest/gtest.h>

#include "unit_hw.hpp"

#include "device/error.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload {
namespace {

using testing::op1s;
using testing::unit_hw;

// P (parameter, 100 B); op0 writes A (1000 B) from P, recomputable; op1 writes B (1000 B);
// op2 reads A and B.
trace rerun_case() {
  trace t;
  const auto p = t.add_tensor("P", 100, tensor_kind::parameter);
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  const auto b = t.add_tensor("B", 1000, tensor_kind::activation);
  t.add_op(op1s("make", {p}, {a}, true));
  t.add_op(op1s("other", {}, {b}));
  t.add_op(op1s("use", {a, b}, {}));
  return t;
}

plan drop_and_rerun(const trace& t, std::uint64_t budget) {
  plan p = plan::empty_for(t, "hand", budget);
  p.steps[0].evictions.push_back({1, evict_action::drop});
  p.steps[2].recomputes.push_back(0);
  p.steps[2].evictions.push_back({1, evict_action::drop});
  p.steps[2].evictions.push_back({2, evict_action::drop});
  return p;
}

TEST(SimulatorRecompute, DroppedValueIsMadeAgainOnTheComputeStream) {
  const auto t = rerun_case();
  sim_options o;
  o.record_timeline = true;
  const auto r = simulate(t, drop_and_rerun(t, 2100), unit_hw(), o);
  ASSERT_TRUE(r.feasible()) << r.violations[0];
  // op0 [0,1], op1 [1,2], rerun of op0 [2,3], op2 [3,4]; A never crosses the link.
  EXPECT_DOUBLE_EQ(r.step_seconds, 4.0);
  EXPECT_DOUBLE_EQ(r.compute_seconds, 3.0);
  EXPECT_DOUBLE_EQ(r.recompute_seconds, 1.0);
  EXPECT_EQ(r.recomputes, 1u);
  EXPECT_DOUBLE_EQ(r.stall_seconds, 0.0);
  EXPECT_EQ(r.h2d_bytes + r.d2h_bytes, 0u);
  EXPECT_EQ(r.peak_device_bytes, 2100u);
  // Without the drop, A and B and P would not fit in 1100 + 1000 - 1: the drop is what fits.
  int reruns = 0;
  for (const auto& e : r.timeline)
    if (e.track == sim_track::recompute) {
      ++reruns;
      EXPECT_EQ(e.id, 0u);
      EXPECT_DOUBLE_EQ(e.start, 2.0);
      EXPECT_DOUBLE_EQ(e.end, 3.0);
    }
  EXPECT_EQ(reruns, 1);
  EXPECT_EQ(to_string(sim_track::recompute), "recompute");
}

TEST(SimulatorRecompute, ReadWithoutTheRerunFindsTheValueLost) {
  const auto t = rerun_case();
  plan p = drop_and_rerun(t, 2100);
  p.steps[2].recomputes.clear();
  const auto r = simulate(t, p, unit_hw());
  EXPECT_FALSE(r.feasible());
  ASSERT_FALSE(r.violations.empty());
  EXPECT_NE(r.violations[0].find("value was lost"), std::string::npos) << r.violations[0];
}

TEST(SimulatorRecompute, DroppingAValueNoOpCanMakeAgainIsStillReported) {
  auto t = rerun_case();
  t.ops[0].recomputable = false;
  plan p = drop_and_rerun(t, 2100);
  p.steps[2].recomputes.clear();
  const auto r = simulate(t, p, unit_hw());
  EXPECT_FALSE(r.feasible());
  EXPECT_NE(r.violations[0].find("drops 'A'"), std::string::npos) << r.violations[0];
}

TEST(SimulatorRecompute, PlanValidationNamesTheOp) {
  auto t = rerun_case();
  plan p = drop_and_rerun(t, 2100);
  p.steps[0].recomputes.push_back(0);  // not an earlier op
  EXPECT_THROW(p.validate(t), usage_error);
  p.steps[0].recomputes.clear();
  p.steps[2].recomputes = {1};  // op1 is not recomputable
  try {
    p.validate(t);
    FAIL() << "validate accepted a rerun of an op not marked recomputable";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("'other'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("recomputable"), std::string::npos) << e.what();
  }
}

TEST(SimulatorRecompute, RerunAfterItsInputChangedIsAViolation) {
  // op0 writes A from X; op1 overwrites X; op2 reads A: a rerun of op0 before op2 would read
  // the new X, so its bits would differ.
  trace t;
  const auto x = t.add_tensor("X", 100, tensor_kind::activation);
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  t.add_op(op1s("load", {}, {x}));
  t.add_op(op1s("make", {x}, {a}, true));
  t.add_op(op1s("clobber", {x}, {x}));
  t.add_op(op1s("use", {a, x}, {}));
  plan p = plan::empty_for(t, "hand", 1 << 20);
  p.steps[1].evictions.push_back({a, evict_action::drop});
  p.steps[3].recomputes.push_back(1);
  p.steps[3].evictions.push_back({a, evict_action::drop});
  p.steps[3].evictions.push_back({x, evict_action::drop});
  const auto r = simulate(t, p, unit_hw());
  EXPECT_FALSE(r.feasible());
  ASSERT_FALSE(r.violations.empty());
  EXPECT_NE(r.violations[0].find("has changed"), std::string::npos) << r.violations[0];
}

TEST(SimulatorRecompute, ChainsRerunInListOrder) {
  // op0 writes A from P, op1 writes B from A (both recomputable), op2 is idle, op3 reads B.
  trace t;
  const auto pa = t.add_tensor("P", 100, tensor_kind::parameter);
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  const auto b = t.add_tensor("B", 1000, tensor_kind::activation);
  const auto w = t.add_tensor("W", 1000, tensor_kind::workspace);
  t.add_op(op1s("a", {pa}, {a}, true));
  t.add_op(op1s("b", {a}, {b}, true));
  t.add_op(op1s("scratch", {}, {w}));
  t.add_op(op1s("use", {b}, {}));
  plan p = plan::empty_for(t, "hand", 2100);
  p.steps[1].evictions.push_back({a, evict_action::drop});
  p.steps[1].evictions.push_back({b, evict_action::drop});
  p.steps[2].evictions.push_back({w, evict_action::drop});
  p.steps[3].recomputes = {0, 1};
  p.steps[3].evictions.push_back({a, evict_action::drop});
  p.steps[3].evictions.push_back({b, evict_action::drop});
  auto r = simulate(t, p, unit_hw());
  ASSERT_TRUE(r.feasible()) << r.violations[0];
  EXPECT_DOUBLE_EQ(r.step_seconds, 6.0);
  EXPECT_EQ(r.recomputes, 2u);
  EXPECT_EQ(r.peak_device_bytes, 2100u);
  // The wrong order reads A before it is made again.
  p.steps[3].recomputes = {1, 0};
  r = simulate(t, p, unit_hw());
  EXPECT_FALSE(r.feasible());
}

// Note [Rerun temps before the op] (prefetch/recompute.hpp): op0 writes X from P, op1 writes Y
// from X (both recomputable; X is dead after op1), op2 is idle, op3 reads Y and writes G. The
// plan drops Y after op1 and reruns op0 and op1 before op3: X, made only for op1's rerun, goes
// once the reruns have run, so op3's G takes its bytes: P + X + Y during the reruns, P + Y + G
// at op3, never all four.
trace temp_case() {
  trace t;
  const auto pa = t.add_tensor("P", 100, tensor_kind::parameter);
  const auto x = t.add_tensor("X", 1000, tensor_kind::activation);
  const auto y = t.add_tensor("Y", 1000, tensor_kind::activation);
  const auto g = t.add_tensor("G", 1000, tensor_kind::activation);
  t.add_op(op1s("x", {pa}, {x}, true));
  t.add_op(op1s("y", {x}, {y}, true));
  t.add_op(op1s("idle", {}, {}));
  t.add_op(op1s("use", {y}, {g}));
  return t;
}
plan temp_plan(const trace& t, std::uint64_t budget) {
  plan p = plan::empty_for(t, "hand", budget);
  p.steps[1].evictions.push_back({1, evict_action::drop});  // X: dead
  p.steps[1].evictions.push_back({2, evict_action::drop});  // Y: made again before op3
  p.steps[3].recomputes = {0, 1};
  p.steps[3].evictions.push_back({2, evict_action::drop});
  p.steps[3].evictions.push_back({3, evict_action::drop});
  return p;
}

TEST(SimulatorRecompute, ARerunTempTheOpDoesNotTouchIsFreedBeforeTheOpAllocates) {
  const auto t = temp_case();
  auto r = simulate(t, temp_plan(t, 2100), unit_hw());
  ASSERT_TRUE(r.feasible()) << r.violations[0];
  EXPECT_EQ(r.peak_device_bytes, 2100u);
  EXPECT_DOUBLE_EQ(r.step_seconds, 6.0);
  EXPECT_EQ(r.recomputes, 2u);
  // A drop of the temp after op3 (as a plan may still say) finds it gone and is no violation.
  plan also = temp_plan(t, 2100);
  also.steps[3].evictions.push_back({1, evict_action::drop});
  r = simulate(t, also, unit_hw());
  EXPECT_TRUE(r.feasible()) << r.violations[0];
  // A byte less and the reruns' own values do not fit.
  EXPECT_FALSE(simulate(t, temp_plan(t, 2099), unit_hw()).feasible());
  // Where op3 also reads X, X stays through op3: all four at once.
  auto reads_x = temp_case();
  reads_x.ops[3].reads.push_back(1);
  plan keeps_x = temp_plan(reads_x, 2100);
  keeps_x.steps[3].evictions.push_back({1, evict_action::drop});
  EXPECT_FALSE(simulate(reads_x, keeps_x, unit_hw()).feasible());
  keeps_x.budget_bytes = 3100;
  r = simulate(reads_x, keeps_x, unit_hw());
  EXPECT_TRUE(r.feasible()) << r.violations[0];
  EXPECT_EQ(r.peak_device_bytes, 3100u);
}

// A parameter that starts in the host tier and that the program writes, not reads, after its
// forward read (the bf16 weight a host step refreshes) is still needed by a rerun of that
// forward op: a drop of its device copy keeps the host copy for the rerun's prefetch.
TEST(SimulatorRecompute, AValueALaterRerunReadsKeepsItsTierCopyWhenDropped) {
  trace t;
  const auto pa = t.add_tensor("P", 100, tensor_kind::parameter);
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  const auto b = t.add_tensor("B", 1000, tensor_kind::activation);
  t.add_op(op1s("make", {pa}, {a}, true));
  t.add_op(op1s("other", {}, {b}));
  t.add_op(op1s("use", {a, b}, {}));
  t.add_op(op1s("refresh", {}, {pa}));
  plan p = plan::empty_for(t, "hand", 2100);
  p.initial_tier[pa] = tier::host;
  p.steps[0].prefetches.push_back({pa, tier::host, 0});
  p.steps[0].evictions.push_back({pa, evict_action::drop});
  p.steps[0].evictions.push_back({a, evict_action::drop});
  p.steps[2].prefetches.push_back({pa, tier::host, 2});
  p.steps[2].recomputes.push_back(0);
  p.steps[2].evictions.push_back({a, evict_action::drop});
  p.steps[2].evictions.push_back({b, evict_action::drop});
  p.steps[3].evictions.push_back({pa, evict_action::evict_to_host});
  p.validate(t);
  const auto r = simulate(t, p, unit_hw());
  EXPECT_TRUE(r.feasible()) << r.violations[0];
  EXPECT_EQ(r.recomputes, 1u);
}

TEST(SimulatorRecompute, TraceRefusesRecomputableOpsThatWriteStateOrWorkInPlace) {
  trace t;
  const auto w = t.add_tensor("w", 100, tensor_kind::parameter);
  const auto a = t.add_tensor("a", 100, tensor_kind::activation);
  t.add_op(op1s("make", {w}, {a}, true));
  EXPECT_NO_THROW(t.validate());
  t.add_op(op1s("inplace", {a}, {a}, true));
  EXPECT_THROW(t.validate(), config_error);
  t.ops.pop_back();
  t.add_op(op1s("update", {a}, {w}, true));
  try {
    t.validate();
    FAIL() << "a recomputable op that writes a parameter was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("'update'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spillway::offload

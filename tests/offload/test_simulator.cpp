// Tests of the simulator against timelines worked out by hand (1 s ops, 1000 B/s links), of
// the violations it reports, and of the lower bound (Note [Lower bound]).
#include <gtest/gtest.h>

#include "unit_hw.hpp"

#include "offload/planner.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload {
namespace {

using testing::op1s;
using testing::unit_hw;

// op0 writes A (1000 B); op1 touches nothing; op2 reads A.
trace three_ops() {
  trace t;
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  t.add_op(op1s("make", {}, {a}));
  t.add_op(op1s("idle", {}, {}));
  t.add_op(op1s("use", {a}, {}));
  return t;
}

plan swap_a(const trace& t, std::uint64_t budget, evict_action to, tier from) {
  plan p = plan::empty_for(t, "hand", budget);
  p.steps[0].evictions.push_back({0, to});
  p.steps[1].prefetches.push_back({0, from, 2});
  p.steps[2].evictions.push_back({0, evict_action::drop});
  return p;
}

TEST(Simulator, HandTimelineHost) {
  const auto t = three_ops();
  sim_options o;
  o.record_timeline = true;
  const auto r = simulate(t, swap_a(t, 5000, evict_action::evict_to_host, tier::host), unit_hw(), o);
  // op0 [0,1]; D2H [1,2]; prefetch issued at 1 waits for the host copy: H2D [2,3];
  // op1 [1,2]; op2 waits for A: [3,4].
  EXPECT_TRUE(r.feasible()) << (r.violations.empty() ? "" : r.violations[0]);
  EXPECT_DOUBLE_EQ(r.step_seconds, 4.0);
  EXPECT_DOUBLE_EQ(r.compute_seconds, 3.0);
  EXPECT_DOUBLE_EQ(r.stall_seconds, 1.0);
  EXPECT_EQ(r.h2d_bytes, 1000u);
  EXPECT_EQ(r.d2h_bytes, 1000u);
  EXPECT_EQ(r.peak_device_bytes, 2000u);  // the prefetch took memory before the D2H freed it
  ASSERT_EQ(r.timeline.size(), 5u);
  for (const auto& e : r.timeline) {
    if (e.track == sim_track::d2h) {
      EXPECT_DOUBLE_EQ(e.start, 1.0);
      EXPECT_DOUBLE_EQ(e.end, 2.0);
    }
    if (e.track == sim_track::h2d) {
      EXPECT_DOUBLE_EQ(e.start, 2.0);
      EXPECT_DOUBLE_EQ(e.end, 3.0);
    }
    if (e.track == sim_track::compute && e.id == 2) {
      EXPECT_DOUBLE_EQ(e.start, 3.0);
    }
  }
}

TEST(Simulator, TightBudgetWaitsForTheFree) {
  const auto t = three_ops();
  const auto r = simulate(t, swap_a(t, 1000, evict_action::evict_to_host, tier::host), unit_hw());
  EXPECT_TRUE(r.feasible());
  EXPECT_EQ(r.peak_device_bytes, 1000u);
  EXPECT_DOUBLE_EQ(r.step_seconds, 4.0);
}

// Note [Addresses in the replay]: op0 writes A, which goes to the host after it (D2H [1,2]); op1
// writes B; A comes back before op2, which reads both. Counted only, B takes its bytes at 1
// beside A's copy out. Given an address, B waits for the bytes there: placed where A was, op1
// starts when A's copy out ends; placed apart, nothing changes. A layout (hand-made, one block
// per allocation, keyed as make_layout keys them) with no place for an allocation leaves it to
// the count.
TEST(Simulator, AnAllocationWaitsForTheBytesItsAddressGivesIt) {
  trace t;
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  const auto b = t.add_tensor("B", 1000, tensor_kind::activation);
  t.add_op(op1s("make A", {}, {a}));
  t.add_op(op1s("make B", {}, {b}));
  t.add_op(op1s("use", {a, b}, {}));
  plan p = plan::empty_for(t, "hand", 3000);
  p.steps[0].evictions.push_back({a, evict_action::evict_to_host});
  p.steps[2].prefetches.push_back({a, tier::host, 2});
  p.steps[2].evictions.push_back({a, evict_action::drop});
  p.steps[2].evictions.push_back({b, evict_action::drop});
  auto layout_with_b_at = [&](std::size_t b_offset) {
    device_layout l;
    auto key = [](tensor_id x, std::uint32_t slot) { return (static_cast<std::uint64_t>(x) << 32) | slot; };
    l.offsets[key(a, layout_slot::place(0))] = 0;
    l.offsets[key(b, layout_slot::place(1))] = b_offset;
    l.offsets[key(a, layout_slot::prefetch(2))] = 2048;
    return l;
  };
  const auto counted = simulate(t, p, unit_hw());
  ASSERT_TRUE(counted.feasible()) << counted.violations[0];
  // op0 [0,1], A out [1,2], op1 [1,2], A in [2,3], op2 [3,4].
  EXPECT_DOUBLE_EQ(counted.step_seconds, 4.0);
  sim_options o;
  const auto over_a = layout_with_b_at(0);
  o.layout = &over_a;
  const auto waited = simulate(t, p, unit_hw(), o);
  ASSERT_TRUE(waited.feasible()) << waited.violations[0];
  // op1 waits for A's bytes: [2,3]; A in [3,4]; op2 [4,5].
  EXPECT_DOUBLE_EQ(waited.step_seconds, 5.0);
  EXPECT_DOUBLE_EQ(waited.stall_seconds, 2.0);
  const auto apart = layout_with_b_at(1024);
  o.layout = &apart;
  EXPECT_DOUBLE_EQ(simulate(t, p, unit_hw(), o).step_seconds, 4.0);
  const device_layout none;
  o.layout = &none;
  EXPECT_DOUBLE_EQ(simulate(t, p, unit_hw(), o).step_seconds, 4.0);
}

TEST(Simulator, HandTimelineNvme) {
  const auto t = three_ops();
  const auto r = simulate(t, swap_a(t, 5000, evict_action::evict_to_nvme, tier::nvme), unit_hw());
  // D2H [1,2]; NVMe write [2,4]; NVMe read [4,6]; H2D [6,7]; op2 [7,8].
  EXPECT_TRUE(r.feasible());
  EXPECT_DOUBLE_EQ(r.step_seconds, 8.0);
  EXPECT_EQ(r.nvme_write_bytes, 1000u);
  EXPECT_EQ(r.nvme_read_bytes, 1000u);
  EXPECT_EQ(r.peak_nvme_bytes, 1000u);
}

TEST(Simulator, MissingPrefetchIsFetchedOnDemand) {
  const auto t = three_ops();
  plan p = swap_a(t, 5000, evict_action::evict_to_host, tier::host);
  p.steps[1].prefetches.clear();
  const auto r = simulate(t, p, unit_hw());
  EXPECT_FALSE(r.feasible());
  EXPECT_EQ(r.on_demand_fetches, 1u);
  EXPECT_DOUBLE_EQ(r.step_seconds, 4.0);  // H2D [2,3] on demand, op2 [3,4]
}

TEST(Simulator, DroppingANeededValueIsReported) {
  const auto t = three_ops();
  plan p = swap_a(t, 5000, evict_action::drop, tier::host);
  const auto r = simulate(t, p, unit_hw());
  EXPECT_FALSE(r.feasible());
  ASSERT_FALSE(r.violations.empty());
  EXPECT_NE(r.violations[0].find("drops 'A'"), std::string::npos) << r.violations[0];
}

TEST(Simulator, OverBudgetAndLeaksAreReported) {
  const auto t = three_ops();
  const auto over = simulate(t, swap_a(t, 500, evict_action::evict_to_host, tier::host), unit_hw());
  EXPECT_FALSE(over.feasible());
  EXPECT_NE(over.violations[0].find("over the budget"), std::string::npos) << over.violations[0];
  plan leak = plan::empty_for(t, "leak", 5000);
  const auto r = simulate(t, leak, unit_hw());
  EXPECT_FALSE(r.feasible());
  EXPECT_NE(r.violations.back().find("still on the device"), std::string::npos);
}

TEST(Simulator, PersistentMustEndWhereItStarted) {
  trace t;
  const auto w = t.add_tensor("w", 100, tensor_kind::parameter);
  t.add_op(op1s("use", {w}, {}));
  plan p = plan::empty_for(t, "hand", 1000);
  p.initial_tier[w] = tier::host;
  p.steps[0].prefetches.push_back({w, tier::host, 0});
  auto r = simulate(t, p, unit_hw());
  EXPECT_FALSE(r.feasible());  // never sent back
  p.steps[0].evictions.push_back({w, evict_action::drop});  // unchanged: the host copy stands
  r = simulate(t, p, unit_hw());
  EXPECT_TRUE(r.feasible()) << r.violations[0];
  EXPECT_EQ(r.d2h_bytes, 0u);
  EXPECT_DOUBLE_EQ(r.step_seconds, 1.1);  // H2D 0.1 s, then the op
}

// op0 writes A; op1 uses a workspace as large as the budget; op2 reads A.
TEST(Simulator, LowerBoundAndAutoOnHandCase) {
  trace t;
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  const auto ws = t.add_tensor("W", 1000, tensor_kind::workspace);
  t.add_op(op1s("make", {}, {a}));
  t.add_op(op1s("scratch", {}, {ws}));
  t.add_op(op1s("use", {a}, {}));
  const auto hw = unit_hw();
  const auto rep = analyze(t);
  const auto b = compute_bounds(t, rep, hw, 1000);
  // Order bound at op1: K = S(1000) + A(1000) - B(1000) = 1000 B, and A is off. Its D2H starts
  // after op0 (compute 1 s) and takes 1 s: D = 2; its H2D ends before op2, which still runs 1 s:
  // H = 1 + 1 = 2. At the start of op1: max(1, 2) + max(1 + 1, 2) = 4; at its end:
  // max(2, 2) + max(1, 2) = 4.
  EXPECT_DOUBLE_EQ(b.ideal_seconds, 3.0);
  EXPECT_DOUBLE_EQ(b.order_bound_seconds, 4.0);
  EXPECT_EQ(b.order_bound_op, 1u);
  EXPECT_EQ(b.h2d_min_bytes, 1000u);
  EXPECT_DOUBLE_EQ(b.lower_bound_seconds, 4.0);
  const auto p = make_planner("auto")->make_plan(t, rep, hw, 1000);
  const auto r = simulate(t, p, hw);
  ASSERT_TRUE(r.feasible()) << r.violations[0];
  // D2H [1,2]; op1 waits for the memory [2,3]; H2D [3,4]; op2 [4,5].
  EXPECT_DOUBLE_EQ(r.step_seconds, 5.0);
  EXPECT_GE(r.step_seconds, b.lower_bound_seconds);
  ASSERT_EQ(p.steps[0].evictions.size(), 1u);
  EXPECT_EQ(p.steps[0].evictions[0].action, evict_action::evict_to_host);
}

}  // namespace
}  // namespace spillway::offload

// Rerun schedules (Note [Rerun schedules] in offload/rerun_schedule.cpp): which values may be
// remade, which reruns stand alone, where spread chains run, and the folded trace the swap
// planners see; property tests over random traces, checked by the simulator and by an
// independent replay, and cases on zoo models (suite PlannersRecomputeOnZoo, which
// scripts/test runs in its optimized phase only).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "device/error.hpp"
#include "offload/planner.hpp"
#include "offload/planner_recompute.hpp"
#include "offload/rerun_schedule.hpp"
#include "offload/simulator.hpp"
#include "offload/zoo.hpp"
#include "recompute_test_support.hpp"
#include "../test_seed.hpp"

namespace spillway::offload {
namespace {

using namespace recompute_testing;

// The folded trace counts a value a chain makes only for the next rerun of the same step (Note
// [Rerun temps before the op]) as held while the reruns run, not beside the op's own outputs:
// op0 makes X from P, op1 makes Y from X (X dead after op1), a long op2, op3 reads Y, writes G.
TEST(PlannersRecompute, TheFoldedTraceHoldsAChainsTempsOrTheOpsOutputsNotBoth) {
  for (const std::uint64_t g_bytes : {1000u, 400u}) {
    trace t;
    const auto pa = t.add_tensor("P", 100, tensor_kind::parameter);
    const auto x = t.add_tensor("X", 1000, tensor_kind::activation);
    const auto y = t.add_tensor("Y", 1000, tensor_kind::activation);
    const auto g = t.add_tensor("G", g_bytes, tensor_kind::activation);
    t.add_op("x", {pa}, {x});
    t.add_op("y", {x}, {y});
    t.add_op("long", {}, {});
    t.add_op("use", {y}, {g});
    for (op_index k : {0u, 1u}) t.ops[k].recomputable = true;
    for (auto& o : t.ops) o.flops = 1e9;
    t.ops[2].flops = 1e10;
    const auto hw = test_hw(1e9);
    const auto r = analyze(t);
    const auto cands = detail::remake_candidates(t, r, hw);
    std::vector<char> want(t.tensors.size(), 0);
    want[y] = 1;
    const auto s = detail::schedule_reruns(t, r, hw, cands, want);
    ASSERT_EQ(s.remade, 1u);
    EXPECT_EQ(s.reruns[3], (std::vector<op_index>{0, 1}));
    // P, Y and the larger of X (the reruns) and G (the op): 2100 bytes, not 3100 or 2500.
    EXPECT_EQ(analyze(s.folded).min_budget_bytes, 2100u) << "G of " << g_bytes << " bytes";
    // Planned at that budget, the plan keeps it on the real trace.
    const auto p = detail::unfold_plan(make_planner("lms")->make_plan(s.folded, analyze(s.folded), hw, 2100), s, t.tensors.size());
    const auto sim = simulate(t, r, p, hw);
    EXPECT_TRUE(sim.feasible()) << sim.violations[0];
    EXPECT_EQ(logical_check(t, p), "");
  }
}

// A value read again one op later (a branch output waiting for its shortcut) is a candidate
// only where its writer's inputs are still there then: here n's input a is itself dropped
// over that op, so remaking b would start a chain; with n reading only the weight, b stays.
TEST(PlannersRecompute, AShortStretchIsACandidateOnlyWithoutAChain) {
  for (bool n_reads_a : {true, false}) {
    SCOPED_TRACE(n_reads_a ? "n reads a" : "n reads w");
    trace t;
    const auto w = t.add_tensor("w", 1000, tensor_kind::parameter);
    const auto a = t.add_tensor("a", 100000, tensor_kind::activation);
    const auto b = t.add_tensor("b", 100000, tensor_kind::activation);
    const auto sc = t.add_tensor("s", 100000, tensor_kind::activation);
    const auto y = t.add_tensor("y", 100000, tensor_kind::activation);
    auto op = [&](std::string name, std::vector<tensor_id> r, std::vector<tensor_id> wr) {
      op_desc o;
      o.name = std::move(name);
      o.reads = std::move(r);
      o.writes = std::move(wr);
      o.recomputable = true;
      o.measured_seconds = 1e-3;
      t.add_op(std::move(o));
    };
    op("c", {w}, {a});
    op("n", n_reads_a ? std::vector<tensor_id>{a} : std::vector<tensor_id>{w}, {b});
    op("s", {w}, {sc});
    op("add", {b, sc}, {y});
    for (int i = 0; i < 10; ++i) op("idle" + std::to_string(i), {w, y}, {});
    op("back", {a, y}, {});
    const auto rep = analyze(t);
    const auto cands = detail::remake_candidates(t, rep, test_hw(1e9));
    auto has = [&](tensor_id x) {
      return std::any_of(cands.begin(), cands.end(), [&](const detail::remake_candidate& c) { return c.x == x; });
    };
    EXPECT_TRUE(has(a));  // a long stretch: always a candidate
    EXPECT_EQ(has(b), !n_reads_a);
  }
}

// Single reruns: no chosen value's writer reads another chosen value or one dead by the time
// the value is made again (so no rerun needs another), and every candidate left out has a
// reason: one of those, or it is an input of the writer of one chosen before it. Random
// traces, random orders.
TEST(PlannersRecompute, SingleRerunsNeedNoOtherRerunAndMissNone) {
  std::mt19937_64 rng(spillway::test::test_seed(1201));
  std::size_t chosen_total = 0, left_total = 0;
  for (int iter = 0; iter < 200; ++iter) {
    const auto t = random_training(rng);
    const auto rep = analyze(t);
    const auto cands = detail::remake_candidates(t, rep, test_hw(1e9));
    std::vector<std::size_t> order(cands.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    const auto single = detail::single_reruns(t, rep, cands, order);
    ASSERT_TRUE(std::is_sorted(single.begin(), single.end()));
    std::vector<char> chosen(t.tensors.size(), 0), in_single(order.size(), 0);
    for (auto i : single) {
      ASSERT_LT(i, order.size());
      chosen[cands[order[i]].x] = 1;
      in_single[i] = 1;
    }
    for (auto i : single) {
      const auto& c = cands[order[i]];
      for (tensor_id in : t.ops[c.writer].reads) {
        EXPECT_FALSE(chosen[in]) << "iteration " << iter << ": the rerun of " << t.tensors[c.x].name << " needs "
                                 << t.tensors[in].name << ", also dropped";
        if (!is_persistent(t.tensors[in].kind)) {
          EXPECT_GE(rep.tensors[in].last_use(), c.use) << "iteration " << iter << ": " << t.tensors[in].name << " is dead before "
                                                      << t.tensors[c.x].name << " is made again";
        }
      }
    }
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (in_single[i]) continue;
      const auto& c = cands[order[i]];
      bool reason = false;
      for (tensor_id in : t.ops[c.writer].reads)
        reason |= !is_persistent(t.tensors[in].kind) && rep.tensors[in].last_use() < c.use;
      for (std::size_t j = 0; j < i; ++j) {
        if (!in_single[j]) continue;
        const auto& d = cands[order[j]];
        for (tensor_id in : t.ops[c.writer].reads) reason |= in == d.x;
        for (tensor_id in : t.ops[d.writer].reads) reason |= in == c.x;
      }
      EXPECT_TRUE(reason) << "iteration " << iter << ": " << t.tensors[c.x].name << " left out for no reason";
    }
    chosen_total += single.size();
    left_total += order.size() - single.size();
  }
  EXPECT_GT(chosen_total, 0u);
  EXPECT_GT(left_total, 0u);  // the traces do have chains to refuse
}

// Spread chains (Note [Rerun schedules]): on random traces, every candidate dropped, the reruns
// spread over the ops before the one they serve; a swap plan of the folded trace, unfolded, is
// feasible in the simulator and passes the independent replay, and no rerun comes before its op
// or after the op it serves. Made values are kept, dropped again, or (every third trace) kept
// but for a random half made again; made again for every value, the schedule is the one that
// keeps none.
TEST(PlannersRecompute, SpreadChainsGiveFeasiblePlans) {
  std::mt19937_64 rng(spillway::test::test_seed(1202));
  int spread_plans = 0, checked = 0;
  for (int iter = 0; iter < 150; ++iter) {
    const auto t = random_training(rng);
    const auto hw = test_hw(iter % 2 ? 1e8 : 1e9);
    const auto rep = analyze(t);
    const auto cands = detail::remake_candidates(t, rep, hw);
    std::vector<char> want(t.tensors.size(), 1);
    std::vector<char> again;
    if (iter % 3 == 2)
      for (std::size_t x = 0; x < t.tensors.size(); ++x) again.push_back(static_cast<char>(rng() % 2));
    const auto s = detail::schedule_reruns(t, rep, hw, cands, want, iter % 3 != 0, true, again);
    if (iter % 3 == 0) {
      const auto all_again = detail::schedule_reruns(t, rep, hw, cands, want, true, true, std::vector<char>(t.tensors.size(), 1));
      EXPECT_EQ(all_again.reruns, s.reruns) << "iteration " << iter;
    }
    if (s.remade == 0) continue;
    const auto fr = analyze(s.folded);
    const std::uint64_t lo = fr.min_budget_bytes, hi = std::max(fr.peak_live_bytes, lo);
    const auto budget = std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
    SCOPED_TRACE("iteration " + std::to_string(iter) + " budget " + std::to_string(budget));
    // The swap planners do not promise a plan within every budget of the folded trace; where
    // theirs keeps it there, the plan for the real trace must too.
    const auto pf = make_planner(iter % 2 ? "lms" : "auto")->make_plan(s.folded, fr, hw, budget);
    if (!simulate(s.folded, pf, hw).feasible()) continue;
    const auto p = detail::unfold_plan(pf, s, t.tensors.size());
    ASSERT_NO_THROW(p.validate(t));
    const auto sim = simulate(t, p, hw);
    ASSERT_TRUE(sim.feasible()) << sim.violations[0];
    EXPECT_LE(sim.peak_device_bytes, budget);
    EXPECT_EQ(logical_check(t, p), "");
    ++checked;
    bool spread = false;
    for (op_index k = 0; k < p.steps.size(); ++k)
      for (op_index o : p.steps[k].recomputes) {
        EXPECT_LT(o, k);
        // A rerun that serves no read of its own step's op serves a later one: spread.
        bool serves_k = false;
        for (tensor_id z : t.ops[o].writes)
          for (tensor_id y : t.ops[k].reads) serves_k |= y == z;
        spread |= !serves_k;
      }
    spread_plans += spread;
  }
  EXPECT_GT(checked, 75);
  EXPECT_GT(spread_plans, 10) << "the traces must have chains to spread";
}

// The folded trace is for swap planners: its reruns are the schedule's, fixed. A planner that
// would rerun ops (auto) reruns none of it, so every value the unfolded plan reads is there
// (with ops of the folded trace left recomputable, auto dropped a value there and reran its
// writer, unfold_plan kept the schedule's reruns alone, and the real trace read a lost value);
// a plan of the folded trace that reruns an op is refused, not unfolded without it.
TEST(PlannersRecompute, FoldedTracesLeaveNoOpToRerun) {
  std::mt19937_64 rng(spillway::test::test_seed(6));
  int checked = 0;
  for (int iter = 0; iter < 40; ++iter) {
    const auto t = random_training(rng);
    const auto hw = test_hw(iter % 2 ? 1e8 : 1e9);
    const auto rep = analyze(t);
    const auto cands = detail::remake_candidates(t, rep, hw);
    const auto s = detail::schedule_reruns(t, rep, hw, cands, std::vector<char>(t.tensors.size(), 1), true, true);
    if (s.remade == 0) continue;
    SCOPED_TRACE("iteration " + std::to_string(iter));
    for (const auto& op : s.folded.ops) EXPECT_FALSE(op.recomputable) << op.name;
    const auto fr = analyze(s.folded);
    const std::uint64_t budget = fr.min_budget_bytes + (std::max(fr.peak_live_bytes, fr.min_budget_bytes) - fr.min_budget_bytes) / 4;
    auto pf = make_planner("auto")->make_plan(s.folded, fr, hw, budget);
    EXPECT_EQ(pf.recompute_count(), 0u);
    if (simulate(s.folded, pf, hw).feasible()) {
      const auto sim = simulate(t, detail::unfold_plan(pf, s, t.tensors.size()), hw);
      EXPECT_TRUE(sim.feasible()) << sim.violations.front();
      ++checked;
    }
    pf.steps.back().recomputes.push_back(0);
    EXPECT_THROW((void)detail::unfold_plan(pf, s, t.tensors.size()), usage_error);
  }
  EXPECT_GT(checked, 10);
}

// resnet50's values all dropped: spread, the folded trace needs far less memory at its largest
// op than with each chain held whole before the op it serves.
TEST(PlannersRecompute, SpreadChainsHoldLessAtOnce) {
  const auto t = make_model_trace("resnet50", {8, 64});
  const auto rep = analyze(t);
  const auto hw = get_profile("h200");
  const auto cands = detail::remake_candidates(t, rep, hw);
  std::vector<char> want(t.tensors.size(), 1);
  const auto whole = analyze(detail::schedule_reruns(t, rep, hw, cands, want, true, false).folded);
  const auto spread = analyze(detail::schedule_reruns(t, rep, hw, cands, want, true, true).folded);
  EXPECT_LT(4 * spread.min_budget_bytes, 3 * whole.min_budget_bytes)
      << "spread " << spread.min_budget_bytes << " whole " << whole.min_budget_bytes;
}

// Spread within the budget: a rerun moved back from the op it serves never goes to an op that
// would then hold more than the budget. With resnet50's values all dropped but its blocks'
// outputs and the stem's pooled output, on h200 at 1/8 of its peak, a rerun of the first
// block's bn2 had gone beside the backward op of its shortcut's batch norm (709 MiB against
// 689): no swap plan could keep that budget. Given the budget, it waits for a later op.
TEST(PlannersRecomputeOnZoo, SpreadRerunsKeepTheBudget) {
  const auto t = make_model_trace("resnet50");
  const auto rep = analyze(t);
  const auto hw = get_profile("h200");
  const std::uint64_t budget = rep.peak_live_bytes / 8;
  const auto cands = detail::remake_candidates(t, rep, hw);
  std::vector<char> want(t.tensors.size(), 0);
  for (const auto& c : cands) {
    const auto& name = t.tensors[c.x].name;
    want[c.x] = !name.ends_with("relu3.out") && name != "stem.pool.out";
  }
  const auto unbounded = analyze(detail::schedule_reruns(t, rep, hw, cands, want, true, true).folded);
  const auto bounded = analyze(detail::schedule_reruns(t, rep, hw, cands, want, true, true, {}, budget).folded);
  EXPECT_GT(unbounded.min_budget_bytes, budget) << "the case the bound is for";
  EXPECT_LE(bounded.min_budget_bytes, budget);
}

// A spread rerun leaves room for what must stay over its op (Note [Rerun schedules]): G, which
// no rerun can make, is held from op2 to op4. Moved back beside op3, the rerun of op0 would hold
// A there with G and op3's workspace (86 bytes against 85), so G would have to leave the device
// for it; with room_for_held the chain stays whole before op4, which holds 81.
TEST(PlannersRecompute, ASpreadRerunLeavesRoomForAValueHeldOverItsOp) {
  trace t;
  const auto pa = t.add_tensor("P", 1, tensor_kind::parameter);
  const auto a = t.add_tensor("A", 20, tensor_kind::activation);
  const auto b = t.add_tensor("B", 20, tensor_kind::activation);
  const auto g = t.add_tensor("G", 40, tensor_kind::activation);
  const auto w = t.add_tensor("W", 25, tensor_kind::workspace);
  const auto c = t.add_tensor("C", 5, tensor_kind::activation);
  t.add_op("a", {pa}, {a});
  t.add_op("b", {a}, {b});
  t.add_op("g", {pa}, {g});
  t.add_op("long", {}, {w});
  t.add_op("use", {b, g}, {c});
  for (op_index k : {0u, 1u}) t.ops[k].recomputable = true;
  for (auto& o : t.ops) o.flops = 1e9;
  t.ops[3].flops = 1e10;
  const auto hw = test_hw(1e9);
  const auto r = analyze(t);
  const auto cands = detail::remake_candidates(t, r, hw);
  std::vector<char> want(t.tensors.size(), 0);
  want[b] = 1;
  const std::uint64_t budget = 85;
  const auto loose = detail::schedule_reruns(t, r, hw, cands, want, true, true, {}, budget, false);
  const auto held = detail::schedule_reruns(t, r, hw, cands, want, true, true, {}, budget, true);
  ASSERT_EQ(loose.remade, 1u);
  ASSERT_EQ(held.remade, 1u);
  EXPECT_EQ(loose.reruns[3], (std::vector<op_index>{0}));
  EXPECT_EQ(loose.reruns[4], (std::vector<op_index>{1}));
  EXPECT_TRUE(held.reruns[3].empty());
  EXPECT_EQ(held.reruns[4], (std::vector<op_index>{0, 1}));
  EXPECT_EQ(analyze(loose.folded).live_bytes_during[3], 86u) << "the case the room is for";
  const auto fh = analyze(held.folded);
  EXPECT_LE(fh.peak_live_bytes, budget);
  // So the held schedule, planned at that budget, copies nothing; the loose one must.
  const auto plan_of = [&](const detail::rerun_schedule& s) {
    return detail::unfold_plan(make_planner("lms")->make_plan(s.folded, analyze(s.folded), hw, budget), s, t.tensors.size());
  };
  const auto sh = simulate(t, r, plan_of(held), hw);
  const auto sl = simulate(t, r, plan_of(loose), hw);
  ASSERT_TRUE(sh.feasible()) << sh.violations[0];
  EXPECT_EQ(sh.h2d_bytes + sh.d2h_bytes, 0u);
  EXPECT_GT(sl.h2d_bytes + sl.d2h_bytes, 0u);
}

// Per op, the bytes of the transients no rerun can make (not written by exactly one recomputable
// op) that are written before the op and read after it, and that the op does not touch.
std::vector<std::uint64_t> held_over(const trace& t, const lifetime_report& r) {
  std::vector<std::uint64_t> out(t.ops.size(), 0);
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    if (is_persistent(t.tensors[x].kind)) continue;
    const auto& u = r.tensors[x].uses;
    const auto writers = std::count_if(u.begin(), u.end(), [](const tensor_use& e) { return e.writes; });
    const auto by_rerunnable = std::any_of(u.begin(), u.end(), [&](const tensor_use& e) { return e.writes && t.ops[e.op].recomputable; });
    if (writers == 1 && by_rerunnable) continue;
    for (std::size_t i = 0; i + 1 < u.size(); ++i)
      if (u[i + 1].reads)
        for (op_index k = u[i].op + 1; k < u[i + 1].op; ++k) out[k] += t.tensors[x].bytes;
  }
  return out;
}

// The same on random traces: an op whose reruns were all spread to it (none makes a value it
// reads) holds no more than the budget, or than it held alone where that is more; with
// room_for_held, counting the values held over it too.
TEST(PlannersRecompute, SpreadRerunsKeepTheBudgetOnRandomTraces) {
  std::mt19937_64 rng(spillway::test::test_seed(17));
  int spread_to = 0, spread_beside_held = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const auto t = random_training(rng);
    const auto hw = test_hw(iter % 2 ? 1e8 : 1e9);
    const auto rep = analyze(t);
    const auto held = held_over(t, rep);
    const auto cands = detail::remake_candidates(t, rep, hw);
    const std::uint64_t budget = rep.min_budget_bytes + (rep.peak_live_bytes - std::min(rep.peak_live_bytes, rep.min_budget_bytes)) / (2 + iter % 4);
    for (const bool room_for_held : {false, true}) {
      const auto s = detail::schedule_reruns(t, rep, hw, cands, std::vector<char>(t.tensors.size(), 1), iter % 3 != 0, true,
                                             {}, budget, room_for_held);
      SCOPED_TRACE("iteration " + std::to_string(iter) + (room_for_held ? ", room for held values" : ""));
      for (op_index k = 0; k < t.ops.size(); ++k) {
        if (s.reruns[k].empty()) continue;
        bool serves = false;
        for (op_index o : s.reruns[k])
          for (tensor_id z : t.ops[o].writes)
            for (tensor_id y : t.ops[k].reads) serves |= y == z;
        if (serves) continue;
        ++spread_to;
        const std::uint64_t extra = room_for_held ? held[k] : 0;
        spread_beside_held += room_for_held && held[k] > 0;
        EXPECT_LE(s.folded.working_set_bytes(k) + extra, std::max(budget, t.working_set_bytes(k) + extra)) << "op " << k;
      }
    }
  }
  EXPECT_GT(spread_to, 40) << "the traces must have chains to spread";
  EXPECT_GT(spread_beside_held, 5) << "and values held over the ops they spread to";
}

}  // namespace
}  // namespace spillway::offload

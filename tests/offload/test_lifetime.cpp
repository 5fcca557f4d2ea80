// Tests of the lifetime analyzer on hand-built traces whose answers are worked out by hand:
// uses, gaps (with the wrap-around gap of persistent tensors), live and needed bytes, peak.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "offload/lifetime.hpp"

namespace spillway::offload {
namespace {

// w (param, 100 B), g (grad, 100 B), a (act, 10 B), b (act, 20 B), ws (workspace, 5 B)
// op0 fwd1: r{w}     w{a}
// op1 fwd2: r{a}     w{b, ws}
// op2 bwd : r{b, w}  w{g}
// op3 step: r{w, g}  w{w}
struct fixture : ::testing::Test {
  trace t;
  tensor_id w, g, a, b, ws;
  void SetUp() override {
    w = t.add_tensor("w", 100, tensor_kind::parameter);
    g = t.add_tensor("g", 100, tensor_kind::gradient);
    a = t.add_tensor("a", 10, tensor_kind::activation);
    b = t.add_tensor("b", 20, tensor_kind::activation);
    ws = t.add_tensor("ws", 5, tensor_kind::workspace);
    t.add_op("fwd1", {w}, {a});
    t.add_op("fwd2", {a}, {b, ws});
    t.add_op("bwd", {b, w}, {g});
    t.add_op("step", {w, g}, {w});
  }
};

TEST_F(fixture, UsesAndGaps) {
  const auto r = analyze(t);
  const auto& lw = r.tensors[w];
  ASSERT_EQ(lw.uses.size(), 3u);
  EXPECT_EQ(lw.first_use(), 0u);
  EXPECT_EQ(lw.last_use(), 3u);
  EXPECT_TRUE(lw.uses[2].reads && lw.uses[2].writes);
  // gap between op0 and op2 (op1 idle); the wrap gap is empty (used at 3 and 0).
  ASSERT_EQ(lw.gaps.size(), 1u);
  EXPECT_EQ(lw.gaps[0].after, 0u);
  EXPECT_EQ(lw.gaps[0].before, 2u);
  EXPECT_EQ(lw.gaps[0].ops, 1u);
  EXPECT_TRUE(lw.crosses_boundary);
  // g: written at 2, read at 3; wrap gap 0..1 (2 ops), contents not needed (next use writes).
  const auto& lg = r.tensors[g];
  EXPECT_FALSE(lg.crosses_boundary);
  ASSERT_EQ(lg.gaps.size(), 1u);
  EXPECT_TRUE(lg.gaps[0].wraps);
  EXPECT_EQ(lg.gaps[0].ops, 2u);
  EXPECT_FALSE(lg.gaps[0].contents_needed);
  EXPECT_TRUE(r.tensors[a].gaps.empty());
}

TEST_F(fixture, LiveNeededPeakAndMinimum) {
  const auto r = analyze(t);
  // live during: persistent 200 always; a live 0..1, b 1..2, ws 1..1.
  EXPECT_EQ(r.live_bytes_during, (std::vector<std::uint64_t>{210, 235, 220, 200}));
  EXPECT_EQ(r.live_bytes_after, (std::vector<std::uint64_t>{210, 220, 200, 200}));
  EXPECT_EQ(r.peak_live_bytes, 235u);
  EXPECT_EQ(r.peak_op, 1u);
  // needed: w always (read later); g only at 2..3; a 0..1; b 1..2; ws 1.
  EXPECT_EQ(r.needed_bytes_during, (std::vector<std::uint64_t>{110, 135, 220, 200}));
  // working sets: 110, 35, 220, 200 -> least budget 220 at op 2.
  EXPECT_EQ(r.min_budget_bytes, 220u);
  EXPECT_EQ(r.min_budget_op, 2u);
  EXPECT_EQ(r.persistent_bytes, 200u);
  // idle in-iteration values: w at op1 was not written yet this iteration -> 0.
  EXPECT_EQ(r.in_iteration_idle_bytes, (std::vector<std::uint64_t>{0, 0, 0, 0}));
  const auto text = format_report(r, t);
  EXPECT_NE(text.find("during op 1 ('fwd2')"), std::string::npos) << text;
  const auto j = report_to_json(r, t);
  EXPECT_EQ(j["peak_live_bytes"], 235u);
  EXPECT_EQ(j["tensors"][0]["gaps"].size(), 1u);
}

TEST(Lifetime, InIterationIdleBytes) {
  trace t;
  const auto x = t.add_tensor("x", 8, tensor_kind::activation);
  const auto y = t.add_tensor("y", 4, tensor_kind::activation);
  t.add_op("p", {}, {x});
  t.add_op("q", {x}, {y});
  t.add_op("r", {y}, {});
  t.add_op("s", {x}, {});
  const auto r = analyze(t);
  // x written at 0, idle at 2, read at 3.
  EXPECT_EQ(r.in_iteration_idle_bytes, (std::vector<std::uint64_t>{0, 0, 8, 0}));
  EXPECT_EQ(r.live_bytes_during, (std::vector<std::uint64_t>{8, 12, 12, 8}));
}

TEST(Lifetime, UnusedPersistentIsLiveButNotNeeded) {
  trace t;
  t.add_tensor("frozen", 50, tensor_kind::parameter);
  const auto x = t.add_tensor("x", 8, tensor_kind::activation);
  t.add_op("p", {}, {x});
  const auto r = analyze(t);
  EXPECT_EQ(r.live_bytes_during[0], 58u);
  EXPECT_EQ(r.needed_bytes_during[0], 8u);
  EXPECT_FALSE(r.tensors[0].used());
}

}  // namespace
}  // namespace spillway::offload

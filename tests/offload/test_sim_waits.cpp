// Where a simulated step's time goes (offload/sim_waits.hpp): the waits of the compute stream
// and the copies behind them, and each stream's busy time by phase.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "offload/sim_waits.hpp"
#include "offload/simulator.hpp"
#include "offload/zoo.hpp"

using namespace spillway;
using namespace spillway::offload;

namespace {

void event(sim_result& s, sim_track k, std::uint32_t id, double a, double b) { s.timeline.push_back({k, id, a, b, 1}); }

// Four ops, one per phase in turn: forward, forward, backward, optimizer.
trace four_ops() {
  trace t;
  const auto x = t.add_tensor("x", 4, tensor_kind::activation);
  const op_phase phases[] = {op_phase::forward, op_phase::forward, op_phase::backward, op_phase::optimizer};
  for (int k = 0; k < 4; ++k) {
    op_desc op;
    op.name = "op" + std::to_string(k);
    op.reads = {x};
    op.phase = phases[k];
    t.add_op(op);
  }
  return t;
}

}  // namespace

// The waits of a hand-made timeline: op 1 waits 2 s for tensor 7's copy in, op 2 starts as
// tensor 3's copy out ends (the memory it frees) 1 s after op 1; a rerun waits 0.5 s for a copy
// of tensor 4 to NVMe; the 0.1 s gap is below the least, and the wait no copy ends is left out.
TEST(SimWaits, WaitedCopiesNamesWhatEachWaitAwaited) {
  sim_result s;
  event(s, sim_track::compute, 0, 0, 1);
  event(s, sim_track::h2d, 7, 0.5, 3);
  event(s, sim_track::d2h, 3, 1, 5);
  event(s, sim_track::d2h, 9, 1, 4.5);  // ends before the wait's end: not what op 2 waited for
  event(s, sim_track::compute, 2, 5, 6);
  event(s, sim_track::compute, 1, 3, 4);
  event(s, sim_track::nvme_write, 4, 2, 6.5);
  event(s, sim_track::recompute, 5, 6.5, 7);
  event(s, sim_track::compute, 6, 7.1, 8);    // 0.1 s gap
  event(s, sim_track::compute, 8, 10, 11);    // a 2 s gap no copy ends
  const auto w = waited_copies(s, 0.2);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].copies, std::vector<tensor_id>{7});
  EXPECT_EQ(w[0].tracks, std::vector<sim_track>{sim_track::h2d});
  EXPECT_EQ(w[0].op, 1u);
  EXPECT_DOUBLE_EQ(w[0].seconds, 2);
  EXPECT_EQ(w[1].copies, std::vector<tensor_id>{3});
  EXPECT_EQ(w[1].tracks, std::vector<sim_track>{sim_track::d2h});
  EXPECT_EQ(w[1].op, 2u);
  EXPECT_FALSE(w[1].rerun);
  EXPECT_EQ(w[2].copies, std::vector<tensor_id>{4});
  EXPECT_EQ(w[2].tracks, std::vector<sim_track>{sim_track::nvme_write});
  EXPECT_EQ(w[2].op, 5u);
  EXPECT_TRUE(w[2].rerun);
  EXPECT_TRUE(waited_copies(s, 2.5).empty());
}

// What held up a waited copy: the copies that ran back to back before it on its own queue, back
// to the last break in that queue, latest first, each once. Op 1 waits for tensor 3's copy out,
// which ran after tensors 2, 1 and 2 again (no break), and after a break tensor 5; tensor 6 ran
// on the other queue, and tensor 8 after the op started.
TEST(SimWaits, CopiesAheadAreThoseTheWaitedCopysQueueRanWithoutABreakBeforeIt) {
  sim_result s;
  event(s, sim_track::compute, 0, 0, 1);
  event(s, sim_track::d2h, 5, 0, 0.5);
  event(s, sim_track::d2h, 2, 1, 2);  // a break of 0.5 s before it
  event(s, sim_track::d2h, 1, 2, 3.5);
  event(s, sim_track::d2h, 2, 3.5, 4);
  event(s, sim_track::h2d, 6, 1, 4);
  event(s, sim_track::d2h, 3, 4, 6);
  event(s, sim_track::d2h, 8, 6, 7);
  event(s, sim_track::compute, 1, 6, 7);
  const auto w = waited_copies(s, 0.5);
  ASSERT_EQ(w.size(), 1u);
  ASSERT_EQ(w[0].copies, std::vector<tensor_id>{3});
  EXPECT_DOUBLE_EQ(w[0].at, 6);
  EXPECT_EQ(copies_ahead(s, w[0], 0), (std::vector<tensor_id>{2, 1}));
  // With a break just before the waited copy, nothing held it up.
  sim_result b;
  event(b, sim_track::compute, 0, 0, 1);
  event(b, sim_track::d2h, 1, 0, 3.9);
  event(b, sim_track::d2h, 3, 4, 6);
  event(b, sim_track::compute, 1, 6, 7);
  const auto wb = waited_copies(b, 0.5);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_TRUE(copies_ahead(b, wb[0], 0).empty());
  EXPECT_DOUBLE_EQ(copy_bytes_per_second(get_profile("h200"), sim_track::d2h), get_profile("h200").d2h_bytes_per_s);
  EXPECT_DOUBLE_EQ(copy_bytes_per_second(get_profile("h200"), sim_track::compute), 0);
}

// The step is cut where the last forward op and the last backward op end; each part counts the
// busy time of its streams, a copy that spans a cut in both parts.
TEST(SimWaits, PhaseUsesCutTheStepAtTheEndOfEachPass) {
  const auto t = four_ops();
  sim_result s;
  s.step_seconds = 7;
  event(s, sim_track::compute, 0, 0, 1);
  event(s, sim_track::compute, 1, 1, 2);
  event(s, sim_track::d2h, 0, 0.5, 2.5);
  event(s, sim_track::h2d, 0, 2, 3);
  event(s, sim_track::recompute, 0, 3, 3.5);  // a rerun before op 2
  event(s, sim_track::compute, 2, 3.5, 5);
  event(s, sim_track::compute, 3, 5, 6);
  event(s, sim_track::d2h, 0, 5.5, 7);
  const auto parts = phase_uses(t, s);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].name, "forward");
  EXPECT_DOUBLE_EQ(parts[0].start, 0);
  EXPECT_DOUBLE_EQ(parts[0].end, 2);
  EXPECT_DOUBLE_EQ(parts[0].compute, 2);
  EXPECT_DOUBLE_EQ(parts[0].d2h, 1.5);
  EXPECT_DOUBLE_EQ(parts[0].h2d, 0);
  EXPECT_EQ(parts[1].name, "backward");
  EXPECT_DOUBLE_EQ(parts[1].end, 5);
  EXPECT_DOUBLE_EQ(parts[1].compute, 2);  // the op and a rerun
  EXPECT_DOUBLE_EQ(parts[1].h2d, 1);
  EXPECT_DOUBLE_EQ(parts[1].d2h, 0.5);
  EXPECT_EQ(parts[2].name, "after");
  EXPECT_DOUBLE_EQ(parts[2].end, 7);
  EXPECT_DOUBLE_EQ(parts[2].compute, 1);
  EXPECT_DOUBLE_EQ(parts[2].d2h, 1.5);
}

TEST(SimWaits, ATraceWithoutPassesIsOnePart) {
  trace t;
  const auto x = t.add_tensor("x", 4, tensor_kind::activation);
  t.add_op("a", {}, {x});
  sim_result s;
  s.step_seconds = 3;
  event(s, sim_track::compute, 0, 1, 3);
  event(s, sim_track::h2d, 0, 0, 1);
  const auto parts = phase_uses(t, s);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].name, "step");
  EXPECT_DOUBLE_EQ(parts[0].compute, 2);
  EXPECT_DOUBLE_EQ(parts[0].h2d, 1);
}

// On a real plan: the parts tile the step, their compute adds up to the simulator's compute
// and reruns, and their copy time to the bytes over the link; the waits add up to no more than
// the stalls, and each names a copy that ended as the op started.
TEST(SimWaits, OnAPlannedModelThePartsAddUpToTheSimulation) {
  zoo_options o;
  o.batch = 2;
  o.seq = 128;
  o.layers = 2;
  const auto t = make_model_trace("gpt2-small", o);
  const auto r = analyze(t);
  auto hw = get_profile("h200");
  hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 2e9;  // a slow link, so that the compute waits
  const auto p = make_planner("auto")->make_plan(t, r, hw, r.min_budget_bytes + (r.peak_live_bytes - r.min_budget_bytes) / 4);
  sim_options so;
  so.record_timeline = true;
  const auto s = simulate(t, r, p, hw, so);
  ASSERT_TRUE(s.feasible());
  const auto parts = phase_uses(t, s);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_DOUBLE_EQ(parts.front().start, 0);
  EXPECT_DOUBLE_EQ(parts.back().end, s.step_seconds);
  double compute = 0, h2d = 0, d2h = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) {
      EXPECT_DOUBLE_EQ(parts[i].start, parts[i - 1].end);
    }
    compute += parts[i].compute;
    h2d += parts[i].h2d;
    d2h += parts[i].d2h;
  }
  EXPECT_NEAR(compute, s.compute_seconds + s.recompute_seconds, 1e-9);
  EXPECT_NEAR(h2d, static_cast<double>(s.h2d_bytes) / hw.h2d_bytes_per_s, 1e-9);
  EXPECT_NEAR(d2h, static_cast<double>(s.d2h_bytes) / hw.d2h_bytes_per_s, 1e-9);
  const auto waits = waited_copies(s, 0);
  ASSERT_FALSE(waits.empty());
  double waited = 0;
  for (const auto& w : waits) {
    waited += w.seconds;
    ASSERT_EQ(w.copies.size(), w.tracks.size());
    for (auto k : w.tracks) EXPECT_TRUE(k == sim_track::h2d || k == sim_track::d2h) << to_string(k);
  }
  EXPECT_LE(waited, s.stall_seconds + 1e-9);
  EXPECT_GT(waited, 0);
  // The copies ahead of each waited copy and the copy itself fill its queue without a break
  // (their durations add up to the stretch from the first one's start to the waited copy's end),
  // and that queue was idle just before the stretch.
  std::size_t looked = 0;
  for (const auto& w : waits)
    for (std::size_t i = 0; i < w.copies.size(); ++i) {
      const auto ahead = copies_ahead(s, w, i);
      double first = 0, end = 0, busy = 0;
      bool found = false;
      for (const auto& e : s.timeline) {
        if (e.track != w.tracks[i] || e.end > w.at + 1e-9) continue;
        if (e.id == w.copies[i] && (!found || e.end > end)) {
          found = true;
          end = e.end;
          first = e.start;
        }
      }
      ASSERT_TRUE(found);
      busy = end - first;
      for (const auto& e : s.timeline)
        if (e.track == w.tracks[i] && e.end <= first + 1e-9 &&
            std::find(ahead.begin(), ahead.end(), e.id) != ahead.end())
          first = std::min(first, e.start);
      double sum = 0;
      for (const auto& e : s.timeline)
        if (e.track == w.tracks[i] && e.start >= first - 1e-9 && e.end <= end + 1e-9) sum += e.end - e.start;
      EXPECT_NEAR(sum, end - first, 1e-9) << "a break in the stretch ahead of copy " << w.copies[i];
      for (const auto& e : s.timeline)  // and the stretch starts after a break
        if (e.track == w.tracks[i] && e.start < first - 1e-9) {
          EXPECT_LT(e.end, first - 1e-12) << e.id;
        }
      EXPECT_GE(end - first, busy);
      for (tensor_id x : ahead) EXPECT_NE(x, w.copies[i]);
      looked += ahead.size();
    }
  EXPECT_GT(looked, 0u);
}

// Note [Shapes]: a loop whose batches change size within one phase (the smaller last batch of an
// epoch, sequences from a few buckets) plans each shape once. The Session's tensors stay one per
// name and size, a shape seen before takes its kept plan back instead of being planned again, and
// the values are those of the everything-resident run under every policy.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "offload/session_hooks.hpp"
#include "offload/swap_policy.hpp"
#include "loop_config.hpp"
#include "watchdog.hpp"
#include "../test_seed.hpp"

using namespace spillway;

namespace {

constexpr int layers = 4;
constexpr std::size_t words = 2048;      // per weight
constexpr std::size_t row_words = 1024;  // per sample of an activation
constexpr std::size_t loss_words = 8;

struct outcome {
  std::vector<std::vector<std::uint32_t>> losses;  // per step
  std::vector<std::vector<std::uint32_t>> params;  // w, m after the last step
  std::vector<iteration_report> reports;
  std::vector<std::size_t> plans_after;   // plans made so far, after each step
  std::vector<std::size_t> tensors_after; // tensors of the followed trace, after each step
};

/// Integer arithmetic throughout, so every policy and budget must give the resident bits.
class loop {
 public:
  explicit loop(Session& s) : s_(s) {
    std::vector<std::uint32_t> init(words);
    for (int l = 0; l < layers; ++l) {
      for (std::size_t i = 0; i < words; ++i) init[i] = static_cast<std::uint32_t>(i * 13 + l * 977 + 5);
      w_.push_back(s.add_persistent("w" + std::to_string(l), words * 4, tensor_kind::parameter, init.data()));
      g_.push_back(s.add_persistent("g" + std::to_string(l), words * 4, tensor_kind::gradient));
      m_.push_back(s.add_persistent("m" + std::to_string(l), words * 4, tensor_kind::optimizer_state));
    }
  }

  /// One step of `batch` samples; `eval`: the forward pass alone (an evaluation pass).
  void step(int batch, int it, outcome& out, bool tagged = false, bool eval = false) {
    const std::size_t n = static_cast<std::size_t>(batch) * row_words;
    if (tagged) {
      s_.begin_iteration("batch-" + std::to_string(batch));
    } else {
      s_.begin_iteration();
    }
    std::vector<tensor_handle> act;
    for (int l = 0; l < layers; ++l) {
      act.push_back(s_.add_transient("act" + std::to_string(l), n * 4));
      if (l == 0) {
        auto op = s_.op("fwd0", {w_[0]}, {act[0]});
        kernel(op, [w = op.ptr<std::uint32_t>(w_[0]), a = op.ptr<std::uint32_t>(act[0]), n, it] {
          for (std::size_t i = 0; i < n; ++i) a[i] = w[i % words] * 3 + static_cast<std::uint32_t>(it + i / row_words);
        });
      } else {
        auto op = s_.op("fwd" + std::to_string(l), {act[l - 1], w_[l]}, {act[l]});
        kernel(op, [x = op.ptr<std::uint32_t>(act[l - 1]), w = op.ptr<std::uint32_t>(w_[l]), y = op.ptr<std::uint32_t>(act[l]), n] {
          for (std::size_t i = 0; i < n; ++i) y[i] = (x[i] * 2654435761u) ^ w[i % words];
        });
      }
    }
    auto loss = s_.add_transient("loss", loss_words * 4, tensor_kind::metric);
    {
      auto op = s_.op("loss", {act[layers - 1]}, {loss});
      kernel(op, [x = op.ptr<std::uint32_t>(act[layers - 1]), y = op.ptr<std::uint32_t>(loss), n] {
        for (std::size_t j = 0; j < loss_words; ++j) {
          std::uint32_t sum = 0;
          for (std::size_t i = j; i < n; i += loss_words) sum += x[i];
          y[j] = sum;
        }
      });
    }
    std::vector<std::uint32_t> l(loss_words);
    s_.read(loss, l.data(), loss_words * 4);
    out.losses.push_back(l);
    if (eval) {
      for (auto a : act) s_.release(a);
      s_.release(loss);
      out.reports.push_back(s_.end_iteration());
      return;
    }
    for (int k = layers - 1; k >= 0; --k) {
      const tensor_handle below = k > 0 ? act[k - 1] : act[0];
      auto op = s_.op("bwd" + std::to_string(k), {act[k], below, w_[k]}, {g_[k]});
      kernel(op, [y = op.ptr<std::uint32_t>(act[k]), x = op.ptr<std::uint32_t>(below), w = op.ptr<std::uint32_t>(w_[k]),
                  g = op.ptr<std::uint32_t>(g_[k]), n] {
        for (std::size_t j = 0; j < words; ++j) g[j] = w[j];
        for (std::size_t i = 0; i < n; ++i) g[i % words] += y[i] ^ (x[i] >> 3);
      });
      s_.release(act[k]);
    }
    for (int k = 0; k < layers; ++k) {
      auto op = s_.op("adam" + std::to_string(k), {g_[k], m_[k], w_[k]}, {w_[k], m_[k]});
      kernel(op, [g = op.ptr<std::uint32_t>(g_[k]), m = op.ptr<std::uint32_t>(m_[k]), w = op.ptr<std::uint32_t>(w_[k])] {
        for (std::size_t i = 0; i < words; ++i) {
          m[i] = m[i] * 3 + g[i];
          w[i] += m[i] >> 7;
        }
      });
    }
    s_.release(loss);
    out.reports.push_back(s_.end_iteration());
  }

  void finish(outcome& out) {
    for (auto* list : {&w_, &m_})
      for (auto t : *list) {
        std::vector<std::uint32_t> v(words);
        s_.read(t, v.data(), words * 4);
        out.params.push_back(v);
      }
  }

 private:
  template <class F>
  static void kernel(Session::op_scope& op, F f) {
    op.device().launch_kernel(op.stream(), std::move(f));
  }

  Session& s_;
  std::vector<tensor_handle> w_, g_, m_;
};

using spillway::testing::config_for;

outcome run(const session_config& c, const std::vector<int>& batches, bool tagged = false,
            const std::vector<bool>& eval = {}) {
  std::size_t plans = 0;
  session_hooks hooks;
  hooks.edit_plan = [&plans](const trace&, plan&) { ++plans; };  // counts the plans made; changes none
  Session s(c, hooks);
  loop l(s);
  outcome out;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    l.step(batches[i], static_cast<int>(i + 1), out, tagged, i < eval.size() && eval[i]);
    out.plans_after.push_back(plans);
    out.tensors_after.push_back(s.recorded_trace().tensors.size());
  }
  l.finish(out);
  return out;
}

/// The loop at half its footprint under lms and auto (in that order), each checked against the
/// everything-resident run's bits.
std::vector<outcome> at_half_against_resident(const std::vector<int>& batches) {
  const outcome want = run(config_for("none", 0), batches);
  std::vector<outcome> got;
  for (const char* policy : {"lms", "auto"}) {
    got.push_back(run(config_for(policy, 0.5), batches));
    EXPECT_EQ(got.back().losses, want.losses) << policy;
    EXPECT_EQ(got.back().params, want.params) << policy;
  }
  return got;
}

/// Epochs of three full batches and a smaller last one.
std::vector<int> epochs(int n) {
  std::vector<int> b;
  for (int e = 0; e < n; ++e) b.insert(b.end(), {4, 4, 4, 2});
  return b;
}

TEST(SessionShapes, AnEpochsSmallerLastBatchPlansEachShapeOnce) {
  spillway::testing::watchdog dog("epochs", std::chrono::seconds(240));
  const auto runs = at_half_against_resident(epochs(4));
  for (std::size_t k = 0; k < runs.size(); ++k) {
    SCOPED_TRACE(k == 0 ? "lms" : "auto");
    const outcome& got = runs[k];
    // Epochs 3 and 4 meet only shapes planned before: no plan is made, and the trace the Session
    // keeps does not grow.
    EXPECT_GT(got.plans_after[7], 0u);
    EXPECT_EQ(got.plans_after[15], got.plans_after[7]) << "plans made again for shapes already planned";
    EXPECT_EQ(got.tensors_after[15], got.tensors_after[7]) << "a tensor per size change, not per name and size";
    // Each shape change still runs one step on demand; the steps after it follow the kept plan.
    for (std::size_t i = 8; i < 16; ++i) EXPECT_EQ(got.reports[i].planned, i % 4 != 0 && i % 4 != 3) << "step " << i + 1;
  }
}

// Property: batches drawn from a few buckets in random order give the resident bits, and the
// plans made are bounded by the shapes, not the steps.
TEST(SessionShapes, BucketsInRandomOrderGiveTheResidentBitsAndBoundedPlans) {
  spillway::testing::watchdog dog("buckets", std::chrono::seconds(240));
  std::mt19937_64 pick(spillway::test::test_seed(41));
  for (int round = 0; round < 3; ++round) {
    std::vector<int> batches{4};  // the largest first: the budget is a ratio of its footprint
    for (int i = 0; i < 23; ++i) batches.push_back(1 << (pick() % 3));
    SCOPED_TRACE("round " + std::to_string(round));
    const outcome want = run(config_for("none", 0), batches);
    const outcome got = run(config_for("auto", 0.5), batches);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.params, want.params);
    // Per shape: its first plan, and one more once its first planned step has timed the ops
    // (Note [Timing the plan's ops]); the budget ratio's change plans the first shape once more.
    EXPECT_LE(got.plans_after.back(), 2u * 3 + 2) << "plans made per step, not per shape";
  }
}

// Note [Shape churn]: sizes new at nearly every step (unpadded lengths) are planned four times
// in a row, then one new shape in eight; the bits are the resident run's, and once the sizes
// settle on one the steps follow its plan again.
TEST(SessionShapes, SizesNewAtEveryStepArePlannedInAStreakThenOneInEight) {
  spillway::testing::watchdog dog("churn", std::chrono::seconds(240));
  std::vector<int> batches{12};  // the largest first: the budget is a ratio of its footprint
  for (int b = 1; b <= 11; ++b) batches.push_back(b);         // 11 sizes, each new
  for (int b = 1; b <= 11; ++b) batches.push_back(12 - b);    // the same again: kept or new
  for (int i = 0; i < 8; ++i) batches.push_back(5);           // then they settle
  const auto runs = at_half_against_resident(batches);
  for (std::size_t k = 0; k < runs.size(); ++k) {
    SCOPED_TRACE(k == 0 ? "lms" : "auto");
    const outcome& got = runs[k];
    // Steps 2-5 are new shapes, each planned (the budget ratio's change plans the first shape
    // once more, and its retiming once); from step 6 on one new shape in eight is planned.
    const std::size_t after_streak = got.plans_after[4];
    EXPECT_LE(got.plans_after[22] - after_streak, 3u) << "a plan per new shape after the streak";
    EXPECT_GT(got.plans_after[22], after_streak) << "no new shape planned after the streak";
    // Settled on one size: a plan for it, then every step follows it.
    EXPECT_TRUE(got.reports.back().planned);
    EXPECT_TRUE(got.reports[got.reports.size() - 2].planned);
  }
}

// Sizes that alternate every step, each under its own tag (Note [Phases]): after each tag's
// recording and the step that times its plan, every step follows its tag's plan.
TEST(SessionShapes, SizesUnderTheirOwnTagsFollowTheirPlansEveryStep) {
  std::vector<int> batches;
  for (int i = 0; i < 8; ++i) batches.insert(batches.end(), {4, 2});
  const outcome want = run(config_for("none", 0), batches);
  const outcome got = run(config_for("auto", 0.5), batches, true);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.params, want.params);
  for (std::size_t i = 6; i < batches.size(); ++i) EXPECT_TRUE(got.reports[i].planned) << "step " << i + 1;
  EXPECT_EQ(got.plans_after.back(), got.plans_after[5]) << "planned again after step 6";
}

// An evaluation pass every third step under the training steps' tag (the default): its ops
// differ, so each pass and the step after it run on demand, but from the second pass on neither
// is planned again.
TEST(SessionShapes, UntaggedEvaluationPassesArePlannedOnce) {
  std::vector<int> batches(15, 4);
  std::vector<bool> eval(15, false);
  for (std::size_t i = 2; i < eval.size(); i += 3) eval[i] = true;
  const outcome want = run(config_for("none", 0), batches, false, eval);
  const outcome got = run(config_for("auto", 0.5), batches, false, eval);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.plans_after.back(), got.plans_after[5]) << "planned again after step 6";
  EXPECT_TRUE(got.reports[13].planned) << "the second step after a pass follows the training plan";
}

// Micro-batches of two sizes in turn within each iteration (2, 1, 2 samples): each turn's
// transient keeps its id from one iteration to the next, so the steps after the first plan
// follow it, with the resident bits.
TEST(SessionShapes, SizesInTurnWithinAnIterationKeepTheirIds) {
  auto run_turns = [](const session_config& c, int steps) {
    Session s(c);
    std::vector<std::uint32_t> init(words, 7);
    const auto w = s.add_persistent("w", words * 4, tensor_kind::parameter, init.data());
    const auto g = s.add_persistent("g", words * 4, tensor_kind::gradient);
    std::vector<iteration_report> reports;
    std::vector<std::size_t> ids;
    for (int it = 0; it < steps; ++it) {
      s.begin_iteration();
      for (const int samples : {2, 1, 2}) {
        const std::size_t n = static_cast<std::size_t>(samples) * row_words;
        const auto x = s.add_transient("x", n * 4);
        ids.push_back(x.id);
        {
          auto op = s.op("mb.fwd", {w}, {x});
          op.device().launch_kernel(op.stream(), [wp = op.ptr<std::uint32_t>(w), xp = op.ptr<std::uint32_t>(x), n, it] {
            for (std::size_t i = 0; i < n; ++i) xp[i] = wp[i % words] * 5 + static_cast<std::uint32_t>(i + it);
          });
        }
        {
          auto op = s.op("mb.grad", {x}, {}, {g});
          op.device().launch_kernel(op.stream(), [xp = op.ptr<std::uint32_t>(x), gp = op.ptr<std::uint32_t>(g), n] {
            for (std::size_t i = 0; i < n; ++i) gp[i % words] += xp[i] >> 2;
          });
        }
        s.release(x);
      }
      {
        auto op = s.op("step", {g, w}, {w});
        op.device().launch_kernel(op.stream(), [gp = op.ptr<std::uint32_t>(g), wp = op.ptr<std::uint32_t>(w)] {
          for (std::size_t i = 0; i < words; ++i) wp[i] += gp[i] >> 9;
        });
      }
      reports.push_back(s.end_iteration());
    }
    std::vector<std::uint32_t> out(words);
    s.read(w, out.data(), words * 4);
    return std::tuple{out, reports, ids};
  };
  const auto [want, want_reports, want_ids] = run_turns(config_for("none", 0), 6);
  const auto [got, reports, ids] = run_turns(config_for("auto", 0.75), 6);
  EXPECT_EQ(got, want);
  ASSERT_EQ(ids.size(), 18u);
  for (std::size_t i = 3; i < ids.size(); ++i) EXPECT_EQ(ids[i], ids[i % 3]) << "turn " << i % 3 << " of step " << i / 3 + 1;
  EXPECT_NE(ids[0], ids[2]) << "two values of one size live at once would share an id";
  for (std::size_t i = 2; i < reports.size(); ++i) EXPECT_TRUE(reports[i].planned) << "step " << i + 1;
}


// A loop that names every layer's output alike ("hidden") and releases them all after the
// backward pass: a name added again while its value is live is another tensor, so no layer's
// value overwrites another's; the ids repeat from step to step, so the steps follow their plan,
// with the bits of a run that names each layer's output apart.
TEST(SessionShapes, ALiveNameAddedAgainIsAnotherTensor) {
  constexpr int depth = 4;
  auto run_named = [](const session_config& c, bool alike, int steps) {
    Session s(c);
    std::vector<std::uint32_t> init(words);
    std::vector<tensor_handle> w;
    for (int l = 0; l < depth; ++l) {
      for (std::size_t i = 0; i < words; ++i) init[i] = static_cast<std::uint32_t>(i * 3 + l);
      w.push_back(s.add_persistent("w" + std::to_string(l), words * 4, tensor_kind::parameter, init.data()));
    }
    const auto g = s.add_persistent("g", words * 4, tensor_kind::gradient);
    std::vector<iteration_report> reports;
    std::vector<std::vector<std::uint32_t>> ids;
    for (int it = 0; it < steps; ++it) {
      s.begin_iteration();
      std::vector<tensor_handle> h;
      for (int l = 0; l < depth; ++l) {
        h.push_back(s.add_transient(alike ? std::string("hidden") : "hidden" + std::to_string(l), words * 4));
        std::vector<tensor_handle> reads{w[l]};
        if (l > 0) reads.push_back(h[l - 1]);
        const std::vector<tensor_handle> writes{h[l]};
        auto op = s.op("fwd", reads, writes);
        op.run([&](const Session::op_scope::host_access& a) {
          for (std::size_t i = 0; i < words; ++i)
            a.ptr<std::uint32_t>(h[l])[i] =
                (l > 0 ? a.ptr<std::uint32_t>(h[l - 1])[i] * 2654435761u : static_cast<std::uint32_t>(it)) ^
                a.ptr<std::uint32_t>(w[l])[i];
        });
      }
      for (int l = depth - 1; l >= 0; --l) {
        auto op = s.op("bwd", {h[l]}, {}, {g});
        op.run([&](const Session::op_scope::host_access& a) {
          for (std::size_t i = 0; i < words; ++i) a.ptr<std::uint32_t>(g)[i] += a.ptr<std::uint32_t>(h[l])[i] >> 3;
        });
      }
      for (auto t : h) s.release(t);
      {
        auto op = s.op("step", {g, w[0]}, {w[0]});
        op.run([&](const Session::op_scope::host_access& a) {
          for (std::size_t i = 0; i < words; ++i) a.ptr<std::uint32_t>(w[0])[i] += a.ptr<std::uint32_t>(g)[i] >> 9;
        });
      }
      reports.push_back(s.end_iteration());
      std::vector<std::uint32_t> step_ids;
      for (auto t : h) step_ids.push_back(t.id);
      ids.push_back(step_ids);
    }
    std::vector<std::uint32_t> out(words);
    s.read(w[0], out.data(), words * 4);
    return std::tuple{out, reports, ids};
  };
  const auto want = std::get<0>(run_named(config_for("none", 0), false, 5));
  for (const char* policy : {"none", "lms", "auto"}) {
    SCOPED_TRACE(policy);
    const auto [got, reports, ids] = run_named(config_for(policy, std::string(policy) == "none" ? 0 : 0.6), true, 5);
    EXPECT_EQ(got, want);
    EXPECT_EQ(std::set<std::uint32_t>(ids[0].begin(), ids[0].end()).size(), static_cast<std::size_t>(depth))
        << "live values of one name share a tensor";
    for (std::size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(ids[i], ids[0]) << "step " << i + 1;
    for (std::size_t i = 2; i < reports.size(); ++i) EXPECT_TRUE(reports[i].planned) << "step " << i + 1;
  }
}

}  // namespace

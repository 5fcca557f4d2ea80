// I/O faults in planned iterations: a Session whose NVMe tier starts failing at iteration 3, while
// the plan's prefetches and swap-outs are in flight, reports an io_error naming the tensor and the
// cause, ends the iteration without hanging, loses no persistent tensor and leaves nothing in the
// swap directory. And the budget hint of an op that does not fit is a budget that runs.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "../budget_hint.hpp"
#include "../swap/swap_test_support.hpp"
#include "allocator/device_budget.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/session_hooks.hpp"
#include "offload/swap_policy.hpp"
#include "watchdog.hpp"

using namespace spillway;
using namespace spillway::literals;
using action = test::fault_plan::action;

namespace {

constexpr int layers = 4;
constexpr std::uint64_t layer_bytes = 256_KiB;

session_config nvme_config(const std::string& dir, const std::string& policy) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.device_budget = 600_KiB;  // two layers and a little: the rest lives on NVMe
  c.host_budget = 4_KiB;      // everything that leaves the device goes to NVMe
  c.policy = policy;
  c.link_gbps = 0;
  c.nvme.directories = {dir};
  c.nvme.reserve = 64_MiB;
  c.nvme.block_size = 64_KiB;
  return c;
}

struct model {
  std::vector<tensor_handle> w;
  std::vector<std::vector<unsigned char>> init;
};

model add_layers(Session& s) {
  model m;
  for (int i = 0; i < layers; ++i) {
    m.init.push_back(test::random_bytes(layer_bytes, 100 + i));
    m.w.push_back(s.add_persistent("layer" + std::to_string(i) + ".weight", layer_bytes, tensor_kind::parameter,
                                   m.init.back().data()));
  }
  return m;
}

// One iteration: each layer reads its weight into a small activation (forward), then back; with
// `update`, the backward op also names the weight as written (an in-place step that leaves the
// bytes as they are), so every swap-out of it is a write to NVMe.
// `failing`: the op (in run order, 0 to 2 * layers - 1) whose kernel throws, or -1.
iteration_report iterate(Session& s, const model& m, bool update = false, int failing = -1) {
  s.begin_iteration();
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < layers; ++k) {
      const int i = pass == 0 ? k : layers - 1 - k;
      auto out = s.add_transient("act" + std::to_string(pass) + "." + std::to_string(i), 4_KiB);
      {
        std::vector<tensor_handle> writes{out};
        if (update && pass == 1) writes.push_back(m.w[i]);
        const std::vector<tensor_handle> reads{m.w[i]};
        auto op = s.op("layer" + std::to_string(i) + (pass == 0 ? ".fwd" : ".bwd"), std::span<const tensor_handle>(reads),
                       std::span<const tensor_handle>(writes));
        op.device().launch_kernel(op.stream(), [p = op.ptr<unsigned char>(out), fails = pass * layers + k == failing] {
          if (fails) throw io_error("a kernel failed (injected)", 0);
          p[0] = 1;
        });
      }
      s.release(out);
    }
  }
  return s.end_iteration();
}

// From now on, `count` operations of `kind` (0: all) fail with `error`.
void fail_io(test::fault_plan& f, io_kind kind, int error, std::uint64_t count) {
  f.kind = kind;
  f.error = error;
  f.first = 1;
  f.count = count;
  f.what = action::fail;
}

// Every weight still holds its first value.
void expect_initial_values(Session& s, const model& m) {
  for (int i = 0; i < layers; ++i) {
    std::vector<unsigned char> back(layer_bytes);
    s.read(m.w[i], back.data(), back.size());
    EXPECT_EQ(back, m.init[i]) << "layer" << i << ".weight lost its value";
  }
}

bool names_a_layer(const std::string& m) {
  for (int i = 0; i < layers; ++i)
    if (m.find("layer" + std::to_string(i) + ".weight") != std::string::npos) return true;
  return false;
}

class SessionFaults : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(SessionFaults, ReadsFailingFromIterationThreeWithPrefetchesInFlight) {
  spillway::testing::watchdog dog("ReadsFailingFromIterationThreeWithPrefetchesInFlight", std::chrono::seconds(60));
  test::temp_dir dir;
  auto faults = std::make_shared<test::fault_plan>();
  session_hooks hooks;
  hooks.make_io_queue = test::faulty(faults);
  std::optional<std::string> error;
  {
    Session s(nvme_config(dir.path(), GetParam()), hooks);
    auto m = add_layers(s);
    iterate(s, m);                  // recorded, on demand
    const auto r2 = iterate(s, m);  // planned
    ASSERT_TRUE(r2.planned);
    ASSERT_GT(r2.nvme_read_bytes, 0u) << "the plan moves nothing through NVMe: the test tests nothing";
    // From iteration 3 on, every read from the swap files fails, prefetches included.
    fail_io(*faults, io_kind::read, EIO, 0);
    try {
      iterate(s, m);
    } catch (const io_error& e) {
      error = e.what();
    }
    ASSERT_TRUE(error.has_value()) << "reads failed in a planned iteration and nobody said so";
    EXPECT_TRUE(names_a_layer(*error)) << *error;
    EXPECT_NE(error->find("Input/output error"), std::string::npos) << *error;
    EXPECT_GT(faults->hits, 0u);
    // The values are still there once the drive answers again.
    faults->disarm();
    expect_initial_values(s, m);
  }
  EXPECT_TRUE(dir.empty()) << "the Session left a swap file behind";
}

TEST_P(SessionFaults, WritesFailingFromIterationThreeKeepTheValues) {
  spillway::testing::watchdog dog("WritesFailingFromIterationThreeKeepTheValues", std::chrono::seconds(60));
  test::temp_dir dir;
  auto faults = std::make_shared<test::fault_plan>();
  session_hooks hooks;
  hooks.make_io_queue = test::faulty(faults);
  {
    Session s(nvme_config(dir.path(), GetParam()), hooks);
    auto m = add_layers(s);
    iterate(s, m, true);
    const auto r2 = iterate(s, m, true);
    ASSERT_TRUE(r2.planned);
    ASSERT_GT(r2.nvme_write_bytes, 0u) << "the plan writes nothing to NVMe: the test tests nothing";
    fail_io(*faults, io_kind::write, ENOSPC, 0);
    std::optional<std::string> error;
    try {
      iterate(s, m, true);
    } catch (const io_error& e) {
      error = e.what();
    }
    EXPECT_GT(faults->hits, 0u);
    ASSERT_TRUE(error.has_value()) << "writes failed in a planned iteration and nobody said so";
    EXPECT_TRUE(names_a_layer(*error)) << *error;
    EXPECT_NE(error->find("No space left on device"), std::string::npos) << *error;
    faults->disarm();
    expect_initial_values(s, m);
  }
  EXPECT_TRUE(dir.empty()) << "the Session left a swap file behind";
}

// write() and load() whose NVMe writes fail keep every tensor's earlier value (Note [Puts keep
// the old copy] in prefetch/tier_backing.cpp): the failure is reported, and a read, a save and
// the next iteration find the values as they were.
TEST_P(SessionFaults, AWriteOrLoadWhoseStoreFailsKeepsTheEarlierValues) {
  spillway::testing::watchdog dog("AWriteOrLoadWhoseStoreFailsKeepsTheEarlierValues", std::chrono::seconds(60));
  test::temp_dir dir, ckpt;
  auto faults = std::make_shared<test::fault_plan>();
  session_hooks hooks;
  hooks.make_io_queue = test::faulty(faults);
  {
    Session s(nvme_config(dir.path(), GetParam()), hooks);
    auto m = add_layers(s);
    iterate(s, m);
    ASSERT_TRUE(iterate(s, m).planned);
    (void)s.save(ckpt.path());  // the initial values
    const auto other = test::random_bytes(layer_bytes, 7);
    fail_io(*faults, io_kind::write, ENOSPC, 0);
    for (int i = 0; i < layers; ++i) EXPECT_THROW(s.write(m.w[i], other.data(), other.size()), io_error) << i;
    faults->disarm();
    expect_initial_values(s, m);
    for (int i = 0; i < layers; ++i) s.write(m.w[i], other.data(), other.size());  // all now hold `other`
    fail_io(*faults, io_kind::write, ENOSPC, 0);
    EXPECT_THROW((void)s.load(ckpt.path()), io_error);
    faults->disarm();
    for (int i = 0; i < layers; ++i) {  // each tensor holds one of its two values, none lost
      std::vector<unsigned char> back(layer_bytes);
      s.read(m.w[i], back.data(), back.size());
      EXPECT_TRUE(back == other || back == m.init[i]) << "layer" << i << ".weight lost its value";
    }
    (void)s.load(ckpt.path());
    EXPECT_TRUE(iterate(s, m).planned);
    expect_initial_values(s, m);
  }
  EXPECT_TRUE(dir.empty()) << "the Session left a swap file behind";
}

// A kernel of a planned iteration fails (on a GPU, an error that ends the context), with swaps
// to and from NVMe in flight: the Session reports that error, the next iteration reports it
// again, nothing hangs, and the Session, torn down, leaves no swap file behind.
TEST_P(SessionFaults, AFailedKernelIsReportedAndTheSessionEndsCleanly) {
  spillway::testing::watchdog dog("AFailedKernelIsReportedAndTheSessionEndsCleanly", std::chrono::seconds(60));
  for (const int failing : {1, layers + 1}) {  // a forward op, then a backward op
    SCOPED_TRACE("op " + std::to_string(failing) + " of the iteration fails");
    test::temp_dir dir;
    {
      Session s(nvme_config(dir.path(), GetParam()));
      auto m = add_layers(s);
      iterate(s, m, true);
      ASSERT_TRUE(iterate(s, m, true).planned);
      for (int attempt = 0; attempt < 2; ++attempt) {
        std::optional<std::string> error;
        try {
          iterate(s, m, true, attempt == 0 ? failing : -1);
        } catch (const spillway::error& e) {
          error = e.what();
        }
        ASSERT_TRUE(error.has_value()) << "iteration " << attempt << " after the failure ran on a failed device";
        EXPECT_NE(error->find("a kernel failed (injected)"), std::string::npos) << *error;
      }
    }
    EXPECT_TRUE(dir.empty()) << "the Session left a swap file behind";
  }
}

// A loop that catches a failed step and goes on to the next without end_iteration (Note [Failed
// iterations] in offload/session_impl.hpp): one read from the drive fails; the next step runs,
// values intact, and a few steps on the Session follows its plan again.
TEST_P(SessionFaults, ALoopThatSkipsAFailedStepRunsTheNextOne) {
  spillway::testing::watchdog dog("ALoopThatSkipsAFailedStepRunsTheNextOne", std::chrono::seconds(60));
  test::temp_dir dir;
  auto faults = std::make_shared<test::fault_plan>();
  session_hooks hooks;
  hooks.make_io_queue = test::faulty(faults);
  Session s(nvme_config(dir.path(), GetParam()), hooks);
  auto m = add_layers(s);
  iterate(s, m);
  ASSERT_TRUE(iterate(s, m).planned);
  fail_io(*faults, io_kind::read, EIO, 1);
  int failed = 0;
  iteration_report last;
  for (int step = 0; step < 4; ++step) {
    try {
      last = iterate(s, m);
    } catch (const io_error&) {
      ++failed;  // and on to the next step, as a loop that skips a bad batch does
    }
  }
  EXPECT_EQ(failed, 1) << "one read failed, so one step should have";
  EXPECT_TRUE(last.planned) << "the Session did not go back to its plan after the failed step";
  expect_initial_values(s, m);
}

// The loop's own code throws halfway through a planned step (inside an op's scope or between
// ops), with NVMe moves in flight, and the exception takes the Session with it: nothing hangs,
// and no swap file is left behind.
TEST_P(SessionFaults, ASessionDestroyedHalfwayThroughAStepEndsCleanly) {
  spillway::testing::watchdog dog("ASessionDestroyedHalfwayThroughAStepEndsCleanly", std::chrono::seconds(60));
  test::temp_dir dir;
  struct loop_error {};
  for (int stop_at = 1; stop_at < 2 * layers; stop_at += 3) {
    try {
      Session s(nvme_config(dir.path(), GetParam()));
      auto m = add_layers(s);
      iterate(s, m, true);
      ASSERT_TRUE(iterate(s, m, true).planned);
      s.begin_iteration();
      for (int k = 0; k < 2 * layers; ++k) {
        const int i = k < layers ? k : 2 * layers - 1 - k;
        auto out = s.add_transient("act" + std::to_string(k), 4_KiB);
        {
          auto op = s.op("step" + std::to_string(k), {m.w[i]}, {out});
          if (k == stop_at && stop_at % 2 == 0) throw loop_error{};  // with the op's scope open
        }
        if (k == stop_at) throw loop_error{};
      }
      FAIL() << "the loop did not stop";
    } catch (const loop_error&) {  // NOLINT(bugprone-empty-catch): the loop's own failure, as planned
    }
    EXPECT_TRUE(dir.empty()) << "a Session destroyed after op " << stop_at << " left a swap file behind";
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, SessionFaults, ::testing::Values("auto", "lms"));

// A step whose op asks for more workspace than the budget holds fails with out_of_memory: the loop
// may end it, or the next begin_iteration does; the Session plans only from steps that ran whole.
// A usage error, by contrast, is the loop's mistake and leaves the iteration open.
TEST(SessionFailedIterations, AStepThatRanOutOfMemoryIsEndedByTheLoopOrTheNextBegin) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 1_MiB;
  c.device_budget = 256_KiB;
  c.link_gbps = 0;
  Session s(c);
  auto w = s.add_persistent("w", 4_KiB, tensor_kind::parameter);
  auto step = [&](bool too_much) {
    s.begin_iteration();
    auto a = s.add_transient("a", 4_KiB);
    {
      auto op = s.op("fwd", {w}, {a});
      if (too_much) (void)op.workspace(1_MiB);
    }
    { auto op = s.op("bwd", {a}, {w}); }
    s.release(a);
    return s.end_iteration();
  };
  // The first step fails and the loop ends it itself: nothing is planned from half a step.
  try {
    step(true);
    ADD_FAILURE() << "1 MiB of workspace in a 256 KiB budget";
  } catch (const out_of_memory&) {
    (void)s.end_iteration();
  }
  EXPECT_EQ(s.current_plan(), nullptr) << "a plan was made from a step that failed halfway";
  step(false);
  EXPECT_THROW(step(true), out_of_memory);
  const auto r = step(false);  // begins by ending the failed step
  EXPECT_EQ(s.history().size(), 3u) << "the failed step the loop did not end was reported as if it ran";
  EXPECT_EQ(s.recorded_trace().ops.size(), 2u);
  EXPECT_TRUE(r.planned) << "the step after the failed one should follow the plan made from the whole one";
  // A usage error inside a step leaves it open: beginning another is still reported.
  s.begin_iteration();
  EXPECT_THROW((void)s.op("stray", {tensor_handle{99}}, {}), usage_error);
  EXPECT_THROW(s.begin_iteration(), usage_error);
  (void)s.end_iteration();
}

// An op over a parent split into views needs a gather buffer beside the pieces; where the budget
// holds the pieces but not the buffer too, the op fails with out_of_memory after the executor
// has opened it. The loop skips the step; the next, with per-view ops, runs, and so does the one
// after (the step that failed left the executor's op and iteration ended, not open).
TEST(SessionFailedIterations, AStepWhoseGatherBufferDidNotFitIsSkippedAndTheNextRuns) {
  spillway::testing::watchdog dog("AStepWhoseGatherBufferDidNotFitIsSkippedAndTheNextRuns", std::chrono::seconds(60));
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 1_MiB;
  c.device_budget = 96_KiB;  // both views, or one view and its update's output, not the parent twice
  c.policy = "lms";
  c.link_gbps = 0;
  Session s(c);
  std::vector<unsigned char> init(64_KiB);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = static_cast<unsigned char>(i * 31 + 5);
  auto flat = s.add_persistent("flat", 64_KiB, tensor_kind::parameter, init.data());
  auto lo = s.add_view(flat, 0, 32_KiB);
  auto hi = s.add_view(flat, 32_KiB, 32_KiB);
  int steps_run = 0;
  auto step = [&](bool whole) {
    s.begin_iteration();
    const auto bump = [](const auto& h, tensor_handle t, std::size_t n) {
      auto* p = h.template ptr<unsigned char>(t);
      for (std::size_t i = 0; i < n; ++i) ++p[i];
    };
    if (whole) {
      auto op = s.op("update.flat", {flat}, {flat});
      op.run([&](const auto& h) { bump(h, flat, 64_KiB); });
    } else {
      for (auto v : {lo, hi}) {
        auto op = s.op("update.view", {v}, {v});
        op.run([&](const auto& h) { bump(h, v, 32_KiB); });
      }
    }
    (void)s.end_iteration();
    ++steps_run;
  };
  EXPECT_THROW(step(true), out_of_memory) << "the parent twice in a budget of 1.5 times it";
  for (int i = 0; i < 3; ++i) EXPECT_NO_THROW(step(false)) << "step " << i << " after the failed one";
  EXPECT_EQ(steps_run, 3);
  std::vector<unsigned char> got(64_KiB);
  s.read(flat, got.data(), got.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], static_cast<unsigned char>(init[i] + 3)) << "byte " << i << " of the flat buffer";
  }
}

// A loop that saves a checkpoint or changes the budget right after a failed step
// (one it did not end) gets that call done: the failed step ends first, and the checkpoint holds
// the values the step left, the ones from before it here (the step failed in its first op).
TEST(SessionFailedIterations, CallsBetweenStepsAfterAFailedOneEndItFirst) {
  test::temp_dir dir;
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 1_MiB;
  c.device_budget = 256_KiB;
  c.link_gbps = 0;
  Session s(c);
  std::vector<unsigned char> init(4_KiB, 7);
  auto w = s.add_persistent("w", 4_KiB, tensor_kind::parameter, init.data());
  auto step = [&](bool too_much) {
    s.begin_iteration();
    auto a = s.add_transient("a", 4_KiB);
    {
      auto op = s.op("fwd", {w}, {a});
      if (too_much) (void)op.workspace(1_MiB);
    }
    {
      auto op = s.op("bwd", {a, w}, {w});
      op.run([&](const auto& h) {
        for (std::size_t i = 0; i < 4_KiB; ++i) ++h.template ptr<unsigned char>(w)[i];
      });
    }
    s.release(a);
    return s.end_iteration();
  };
  (void)step(false);  // w: 8
  EXPECT_THROW((void)step(true), out_of_memory);
  EXPECT_NO_THROW(s.save(dir.path(), "after the failed step")) << "save right after a failed step";
  EXPECT_THROW((void)step(true), out_of_memory);
  EXPECT_NO_THROW(s.set_device_budget(192_KiB)) << "a new budget right after a failed step";
  (void)step(false);  // w: 9
  std::vector<unsigned char> got(4_KiB);
  s.read(w, got.data(), got.size());
  EXPECT_EQ(got, std::vector<unsigned char>(4_KiB, 9));
  Session fresh(c);
  std::vector<unsigned char> zero(4_KiB, 0);
  auto w2 = fresh.add_persistent("w", 4_KiB, tensor_kind::parameter, zero.data());
  EXPECT_EQ(fresh.load(dir.path()), "after the failed step");
  fresh.read(w2, got.data(), got.size());
  EXPECT_EQ(got, std::vector<unsigned char>(4_KiB, 8)) << "the checkpoint does not hold the values the failed step left";
  EXPECT_EQ(s.history().size(), 2u) << "a failed step was reported";
}

// ---- the budget hint of an op that does not fit ------------------------------------------------

namespace {
// Runs one iteration of one op over three persistent tensors of `bytes` each.
void one_op(std::uint64_t budget, std::uint64_t bytes) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 1_MiB;
  c.device_budget = budget;
  c.policy = "auto";
  c.link_gbps = 0;
  Session s(c);
  auto a = s.add_persistent("a", bytes, tensor_kind::parameter);
  auto b = s.add_persistent("b", bytes, tensor_kind::parameter);
  auto out = s.add_persistent("out", bytes, tensor_kind::parameter);
  for (int it = 0; it < 2; ++it) {
    s.begin_iteration();
    { auto op = s.op("sum", {a, b}, {out}); }
    s.end_iteration();
  }
}
}  // namespace

// Three 128 B tensors add up to 384 B, but each takes a 512 B granule once placed: the hint must
// name a budget that runs (1.5 KiB), not the unrounded sum.
TEST(SessionBudgetHint, TheHintedBudgetRuns) {
  spillway::testing::watchdog dog("TheHintedBudgetRuns", std::chrono::seconds(60));
  std::string hint;
  std::uint64_t hinted = 0;
  try {
    one_op(1_KiB, 128);
    FAIL() << "three 512 B placements ran in a 1 KiB budget";
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("raise the device budget to at least that"), std::string::npos) << m;
    // The first iteration is being recorded: the message says the least budget is not known yet.
    EXPECT_NE(m.find("while recording an iteration, before any plan"), std::string::npos) << m;
    const auto h = spillway::test::read_budget_hint(m);
    ASSERT_TRUE(h) << m;
    hint = h->shown;
    hinted = h->size();
  }
  EXPECT_EQ(hinted, 3 * device_budget::granule) << hint;
  EXPECT_NO_THROW(one_op(hinted, 128)) << "the hinted budget " << hint << " does not run";
}

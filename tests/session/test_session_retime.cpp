// Note [Timing the plan's ops] (offload/session_impl.hpp): the first planned iteration times its
// ops, and when they differ from the recording's by more than a tenth of the step the trace takes
// them and is planned again, once; steady op times keep the plan.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "watchdog.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr int layers = 6;

struct run_log {
  std::vector<iteration_report> reports;
  std::vector<std::vector<double>> op_seconds;  // the recorded trace's op times after each iteration
};

/// A chain of layers whose kernels sleep `first_ms` in the first iteration and `later_ms` after.
run_log run(double first_ms, double later_ms, int iterations) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.policy = "auto";
  c.link_gbps = 1;  // 64 KiB copies take about 65 us each
  c.device_budget = 320_KiB;
  Session s(c);
  std::vector<unsigned char> init(64_KiB, 1);
  std::vector<tensor_handle> w;
  for (int i = 0; i < layers; ++i)
    w.push_back(s.add_persistent("w" + std::to_string(i), init.size(), tensor_kind::parameter, init.data()));
  run_log log;
  for (int it = 0; it < iterations; ++it) {
    const auto sleep = std::chrono::microseconds(static_cast<long>((it == 0 ? first_ms : later_ms) * 1000));
    s.begin_iteration();
    tensor_handle prev = s.add_transient("x", 32_KiB);
    { auto op = s.op("input", {}, {prev}); }
    for (int i = 0; i < layers; ++i) {
      auto next = s.add_transient("a" + std::to_string(i), 32_KiB);
      {
        auto op = s.op("layer" + std::to_string(i), {w[i], prev}, {next});
        op.device().launch_kernel(op.stream(), [sleep] { std::this_thread::sleep_for(sleep); });
      }
      s.release(prev);
      prev = next;
    }
    for (int i = layers - 1; i >= 0; --i) {
      auto op = s.op("update" + std::to_string(i), {w[i], prev}, {w[i]});
    }
    s.release(prev);
    log.reports.push_back(s.end_iteration());
    std::vector<double> secs;
    for (const auto& op : s.recorded_trace().ops) secs.push_back(op.measured_seconds.value_or(-1));
    log.op_seconds.push_back(secs);
  }
  return log;
}

double layer_seconds(const std::vector<double>& secs) {
  double sum = 0;
  for (int i = 0; i < layers; ++i) sum += secs[static_cast<std::size_t>(1 + i)];  // op 0 is "input"
  return sum;
}

}  // namespace

TEST(SessionRetime, OpsThatRanLongInTheRecordingAreTimedAgainAndPlannedOnce) {
  spillway::testing::watchdog dog("OpsThatRanLongInTheRecordingAreTimedAgainAndPlannedOnce", std::chrono::seconds(60));
  const auto log = run(/*first_ms=*/20, /*later_ms=*/2, 5);
  ASSERT_EQ(log.reports.size(), 5u);
  EXPECT_FALSE(log.reports[0].planned);
  for (std::size_t i = 1; i < log.reports.size(); ++i) EXPECT_TRUE(log.reports[i].planned) << "iteration " << i + 1;
  // After the recording: its times (6 layers of 20 ms). After the first planned one: the later
  // times (2 ms each, give or take the sleeps' overshoot), and the plan's step follows them.
  EXPECT_GT(layer_seconds(log.op_seconds[0]), 6 * 0.019);
  EXPECT_LT(layer_seconds(log.op_seconds[1]), 6 * 0.010);
  EXPECT_GT(layer_seconds(log.op_seconds[1]), 6 * 0.0019);
  EXPECT_LT(log.reports[2].planned_step_ms, 0.5 * log.reports[1].planned_step_ms);
  // Once: the later planned iterations keep that trace and that plan.
  EXPECT_EQ(log.op_seconds[2], log.op_seconds[1]);
  EXPECT_EQ(log.op_seconds[4], log.op_seconds[1]);
  EXPECT_EQ(log.reports[4].planned_step_ms, log.reports[2].planned_step_ms);
}

TEST(SessionRetime, SteadyOpTimesKeepTheRecordedTraceAndItsPlan) {
  spillway::testing::watchdog dog("SteadyOpTimesKeepTheRecordedTraceAndItsPlan", std::chrono::seconds(60));
  const auto log = run(/*first_ms=*/30, /*later_ms=*/30, 4);  // long sleeps: their overshoot is well under a tenth
  ASSERT_EQ(log.reports.size(), 4u);
  EXPECT_EQ(log.op_seconds[1], log.op_seconds[0]) << "times within a tenth of the step moved the trace";
  EXPECT_EQ(log.op_seconds[3], log.op_seconds[0]);
  EXPECT_EQ(log.reports[3].planned_step_ms, log.reports[1].planned_step_ms);
}

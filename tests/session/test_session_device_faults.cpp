// Random device faults under a Session's training loop (session_hooks::wrap_device): in each step
// one device call (a copy, an event record, an event creation or a stream wait), picked at random,
// fails once, and the loop skips a step that fails (Note [Failed iterations]). After every step,
// failed or not, each weight holds its value from before the step or after its update, never
// anything else, and once the device answers again the loop runs on: its steps follow a plan
// again and every weight ends updated once per step that ran whole.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "faulty_session.hpp"
#include "../swap/swap_test_support.hpp"
#include "../test_seed.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "watchdog.hpp"

using namespace spillway;
using namespace spillway::literals;
using test::device_call;
using test::fault_rule;
using test::faulty_device;

namespace {

constexpr int layers = 4;
constexpr std::uint64_t weight_bytes = 64_KiB;
constexpr std::uint64_t act_bytes = 16_KiB;

struct params {
  const char* policy;
  bool nvme;
};

struct loop {
  explicit loop(params p, const std::string& dir) {
    session_config c;
    c.backend = "cpu";
    c.cpu_device_memory = 16_MiB;
    c.device_budget = 2 * weight_bytes + 4 * act_bytes + 64_KiB;  // two layers' weights and a little
    c.policy = p.policy;
    c.link_gbps = 0;
    if (p.nvme) {
      c.host_budget = 4_KiB;  // everything that leaves the device goes to NVMe
      c.nvme.directories = {dir};
      c.nvme.reserve = 16_MiB;
      c.nvme.block_size = 64_KiB;
    }
    s = test::session_over_faulty_device(c, dev);
    for (int i = 0; i < layers; ++i) {
      init.push_back(test::random_bytes(weight_bytes, 300 + static_cast<std::uint64_t>(i)));
      w.push_back(s->add_persistent("layer" + std::to_string(i) + ".weight", weight_bytes, tensor_kind::parameter,
                                    init.back().data()));
      updates.push_back(0);
    }
  }

  // Forward: each layer reads its weight and the activation before it; backward, last layer
  // first: each adds one to every byte of its weight in place.
  iteration_report step() {
    s->begin_iteration();
    std::vector<tensor_handle> acts;
    for (int i = 0; i < layers; ++i) {
      auto out = s->add_transient("act" + std::to_string(i), act_bytes);
      std::vector<tensor_handle> reads{w[static_cast<std::size_t>(i)]};
      if (i > 0) reads.push_back(acts.back());
      const std::vector<tensor_handle> writes{out};
      auto op = s->op("layer" + std::to_string(i) + ".forward", std::span<const tensor_handle>(reads),
                      std::span<const tensor_handle>(writes));
      const auto* pw = op.ptr<unsigned char>(w[static_cast<std::size_t>(i)]);
      auto* po = op.ptr<unsigned char>(out);
      op.device().launch_kernel(op.stream(), [pw, po] {
        for (std::uint64_t j = 0; j < act_bytes; ++j) po[j] = pw[j];
      });
      acts.push_back(out);
    }
    for (int i = layers - 1; i >= 0; --i) {
      const std::vector<tensor_handle> reads{acts[static_cast<std::size_t>(i)], w[static_cast<std::size_t>(i)]};
      const std::vector<tensor_handle> writes{w[static_cast<std::size_t>(i)]};  // in place: read and written
      auto op = s->op("layer" + std::to_string(i) + ".backward", std::span<const tensor_handle>(reads),
                      std::span<const tensor_handle>(writes));
      auto* pw = op.ptr<unsigned char>(w[static_cast<std::size_t>(i)]);
      op.device().launch_kernel(op.stream(), [pw] {
        for (std::uint64_t j = 0; j < weight_bytes; ++j) pw[j] = static_cast<unsigned char>(pw[j] + 1);
      });
    }
    for (auto a : acts) s->release(a);
    return s->end_iteration();
  }

  // Whether weight i holds its value after m updates.
  bool holds(int i, int m) {
    std::vector<unsigned char> got(weight_bytes);
    s->read(w[static_cast<std::size_t>(i)], got.data(), got.size());
    const auto& v0 = init[static_cast<std::size_t>(i)];
    for (std::uint64_t j = 0; j < weight_bytes; ++j)
      if (got[j] != static_cast<unsigned char>(v0[j] + m)) return false;
    return true;
  }

  // Each weight holds its value after `updates[i]` or `updates[i] + 1` updates; the count moves to
  // the one it holds. A value that is neither fails the test.
  void check_weights(const std::string& when) {
    for (int i = 0; i < layers; ++i) {
      int& n = updates[static_cast<std::size_t>(i)];
      if (holds(i, n + 1)) {
        ++n;
      } else {
        EXPECT_TRUE(holds(i, n)) << "layer" << i << ".weight lost its value " << when;
      }
    }
  }

  faulty_device* dev = nullptr;
  std::unique_ptr<Session> s;
  std::vector<tensor_handle> w;
  std::vector<std::vector<unsigned char>> init;
  std::vector<int> updates;
};

class SessionDeviceFaults : public ::testing::TestWithParam<params> {};

}  // namespace

TEST_P(SessionDeviceFaults, RandomFailingCallsLoseNoWeight) {
  spillway::testing::watchdog dog("RandomFailingCallsLoseNoWeight", std::chrono::seconds(120));
  constexpr device_call calls[] = {device_call::copy_async, device_call::record_event, device_call::create_event,
                                   device_call::stream_wait_event};
  std::mt19937_64 rng(spillway::test::test_seed(GetParam().nvme ? 71 : 70));
  int failed_steps = 0;
  for (int round = 0; round < 6; ++round) {
    test::temp_dir dir;
    loop l(GetParam(), dir.path());
    l.step();
    l.check_weights("after the first step");
    for (int k = 0; k < 8; ++k) {
      const device_call c = calls[rng() % std::size(calls)];
      const std::uint64_t skip = rng() % 24;
      const std::string what = std::string("in a step where ") + test::to_string(c) + " number " +
                               std::to_string(skip) + " failed (round " + std::to_string(round) + ")";
      l.dev->fail(c, fault_rule{.skip = skip, .count = 1});
      try {
        l.step();
      } catch (const spillway::error&) {
        ++failed_steps;
      }
      l.dev->heal(c);
      l.check_weights(what);
      if (::testing::Test::HasFailure()) return;
    }
    // The device answers again: the loop runs whole steps, on a plan.
    const int before = l.updates[0];
    iteration_report r;
    for (int k = 0; k < 3; ++k) {
      r = l.step();
      l.check_weights("after a clean step");
    }
    EXPECT_TRUE(r.planned) << "round " << round << ": the loop did not get back to a plan";
    EXPECT_EQ(l.updates[0], before + 3) << "round " << round;
  }
  EXPECT_GT(failed_steps, 0) << "no fault made a step fail: the test tests nothing";
}

INSTANTIATE_TEST_SUITE_P(Plans, SessionDeviceFaults,
                         ::testing::Values(params{"auto", false}, params{"lms", false}, params{"auto", true}),
                         [](const auto& info) {
                           return std::string(info.param.policy) + (info.param.nvme ? "_nvme" : "_host");
                         });

// A checkpoint whose copies the device refuses, one at a time: a save either fails with the
// device's error and leaves the checkpoint before it whole (a fresh Session loads it), or, where
// the library could do without the copy, writes one that holds the current values; no temporary
// file is left either way, and once the device answers the next save works.
TEST(SessionDeviceFaults, ASaveTheDeviceInterruptsLeavesAWholeCheckpoint) {
  spillway::testing::watchdog dog("ASaveTheDeviceInterruptsLeavesAWholeCheckpoint", std::chrono::seconds(120));
  test::temp_dir swap_dir, ckpt_dir;
  loop l(params{"auto", false}, swap_dir.path());
  l.step();
  l.check_weights("after the first step");
  std::string on_disk = "save 0";
  l.s->save(ckpt_dir.path(), on_disk);
  auto on_disk_values = l.updates;
  int refused = 0;
  for (std::uint64_t k = 0; k < 64; ++k) {
    l.step();
    l.check_weights("before save " + std::to_string(k + 1));
    l.dev->fail(device_call::copy_async, fault_rule{.skip = k, .count = 1});
    const std::string meta = "save " + std::to_string(k + 1);
    bool threw = false;
    try {
      l.s->save(ckpt_dir.path(), meta);
    } catch (const spillway::error&) {
      threw = true;
    }
    const bool hit = l.dev->failures(device_call::copy_async) > 0;
    l.dev->heal(device_call::copy_async);
    if (!hit) {  // past the save's last copy
      ::testing::Test::RecordProperty("copies_a_save_makes", static_cast<int>(k));
      break;
    }
    refused += threw ? 1 : 0;
    if (!threw) {
      on_disk = meta;
      on_disk_values = l.updates;
    }
    std::size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(ckpt_dir.path())) {
      ++files;
      EXPECT_EQ(e.path().filename(), "checkpoint.spw") << "left behind: " << e.path();
    }
    EXPECT_EQ(files, 1u);
    test::temp_dir other_swap;
    loop fresh(params{"auto", false}, other_swap.path());
    EXPECT_EQ(fresh.s->load(ckpt_dir.path()), on_disk) << "copy " << k << " of the save failed";
    for (int i = 0; i < layers; ++i)
      EXPECT_TRUE(fresh.holds(i, on_disk_values[static_cast<std::size_t>(i)]))
          << "layer" << i << " in the checkpoint on disk after copy " << k << " of a save failed";
    l.check_weights("after a save whose copy " + std::to_string(k) + " failed");
    if (::testing::Test::HasFailure()) return;
  }
  ::testing::Test::RecordProperty("saves_that_failed", refused);
  EXPECT_GT(refused, 0) << "no refused copy made a save fail: the test tests nothing";
  l.s->save(ckpt_dir.path(), "last");
  test::temp_dir other_swap;
  loop fresh(params{"auto", false}, other_swap.path());
  EXPECT_EQ(fresh.s->load(ckpt_dir.path()), "last");
  for (int i = 0; i < layers; ++i) EXPECT_TRUE(fresh.holds(i, l.updates[static_cast<std::size_t>(i)])) << "layer" << i;
}

// I/O faults in planned iterations: a Session whose NVMe tier starts failing at iteration 3, while
// the plan's prefetches and swap-outs are in flight, reports an io_error naming the tensor and the
// cause, ends the iteration without hanging, loses no persistent tensor and leaves nothing in the
// swap directory. And the budget hint of an op that does not fit is a budget that runs.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

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
iteration_report iterate(Session& s, const model& m, bool update = false) {
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
        op.device().launch_kernel(op.stream(), [p = op.ptr<unsigned char>(out)] { p[0] = 1; });
      }
      s.release(out);
    }
  }
  return s.end_iteration();
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
    faults->kind = io_kind::read;
    faults->error = EIO;
    faults->first = 1;
    faults->count = 0;
    faults->what = action::fail;
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
    for (int i = 0; i < layers; ++i) {
      std::vector<unsigned char> back(layer_bytes);
      s.read(m.w[i], back.data(), back.size());
      EXPECT_EQ(back, m.init[i]) << "layer" << i << ".weight lost its value";
    }
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
    faults->kind = io_kind::write;
    faults->error = ENOSPC;
    faults->first = 1;
    faults->count = 0;
    faults->what = action::fail;
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
    for (int i = 0; i < layers; ++i) {
      std::vector<unsigned char> back(layer_bytes);
      s.read(m.w[i], back.data(), back.size());
      EXPECT_EQ(back, m.init[i]) << "layer" << i << ".weight lost its value";
    }
  }
  EXPECT_TRUE(dir.empty()) << "the Session left a swap file behind";
}

INSTANTIATE_TEST_SUITE_P(Policies, SessionFaults, ::testing::Values("auto", "lms"));

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
  try {
    one_op(1_KiB, 128);
    FAIL() << "three 512 B placements ran in a 1 KiB budget";
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    const auto at = m.find("at least ");
    ASSERT_NE(at, std::string::npos) << m;
    hint = m.substr(at + 9);
    hint = hint.substr(0, hint.find_first_of(";[(\n"));
    while (!hint.empty() && hint.back() == ' ') hint.pop_back();
  }
  const std::uint64_t hinted = parse_size(hint, "hint");
  EXPECT_EQ(hinted, 3 * device_budget::granule) << hint;
  EXPECT_NO_THROW(one_op(hinted, 128)) << "the hinted budget " << hint << " does not run";
}

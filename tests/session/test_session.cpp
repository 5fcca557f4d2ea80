// The Session end to end on the cpu backend: random models, random budgets, every policy. Each op
// writes a pattern derived from (op, iteration) and checks that what it reads holds the pattern
// of its last writer, so stale or lost data fails; device bytes never exceed the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/swap_policy.hpp"
#include "../swap/swap_test_support.hpp"
#include "offload/session_hooks.hpp"
#include "watchdog.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

/// A random model: persistent tensors and a fixed sequence of ops over them and over transients.
struct random_model {
  struct tensor_spec {
    std::string name;
    std::uint64_t bytes;
    tensor_kind kind;
  };
  struct op_spec {
    std::string name;
    std::vector<int> reads, writes;  // indices into tensors
    std::vector<int> creates;        // transients first written here (add_transient before the op)
    std::vector<int> releases;       // transients whose last use is this op
  };
  std::vector<tensor_spec> tensors;
  std::vector<op_spec> ops;
};

random_model make_model(std::mt19937& rng, int n_persistent, int n_ops) {
  random_model m;
  std::uniform_int_distribution<std::uint64_t> size(1, 48);
  for (int i = 0; i < n_persistent; ++i)
    m.tensors.push_back({"p" + std::to_string(i), size(rng) * 1024 + 8 * (rng() % 7), i % 3 == 0 ? tensor_kind::optimizer_state : tensor_kind::parameter});
  std::vector<int> live_transients;
  for (int k = 0; k < n_ops; ++k) {
    random_model::op_spec op;
    op.name = "op" + std::to_string(k);
    std::set<int> reads, writes;
    const int nr = 1 + static_cast<int>(rng() % 3);
    for (int r = 0; r < nr; ++r) {
      if (!live_transients.empty() && rng() % 2 == 0) reads.insert(live_transients[rng() % live_transients.size()]);
      else reads.insert(static_cast<int>(rng() % n_persistent));
    }
    if (rng() % 4 == 0) writes.insert(static_cast<int>(rng() % n_persistent));  // an in-place update
    if (k + 1 < n_ops || rng() % 2 == 0) {
      const int t = static_cast<int>(m.tensors.size());
      m.tensors.push_back({"a" + std::to_string(k), size(rng) * 1024 + 8 * (rng() % 5), tensor_kind::activation});
      writes.insert(t);
      op.creates.push_back(t);
      live_transients.push_back(t);
    }
    op.reads.assign(reads.begin(), reads.end());
    op.writes.assign(writes.begin(), writes.end());
    m.ops.push_back(op);
  }
  // Each transient dies after its last use.
  std::map<int, int> last_use;
  for (int k = 0; k < n_ops; ++k) {
    for (int t : m.ops[k].reads) last_use[t] = k;
    for (int t : m.ops[k].writes) last_use[t] = k;
  }
  for (auto [t, k] : last_use)
    if (m.tensors[t].kind == tensor_kind::activation) m.ops[k].releases.push_back(t);
  return m;
}

std::uint64_t tag(int op, int iteration) { return (static_cast<std::uint64_t>(iteration) << 32) ^ (op * 2654435761u) ^ 0x5a5a; }

void fill(void* p, std::uint64_t bytes, std::uint64_t t) {
  auto* w = static_cast<unsigned char*>(p);
  for (std::uint64_t i = 0; i < bytes; ++i) w[i] = static_cast<unsigned char>((t >> ((i % 8) * 8)) + i / 8);
}
bool holds(const void* p, std::uint64_t bytes, std::uint64_t t) {
  const auto* w = static_cast<const unsigned char*>(p);
  for (std::uint64_t i = 0; i < bytes; ++i)
    if (w[i] != static_cast<unsigned char>((t >> ((i % 8) * 8)) + i / 8)) return false;
  return true;
}

struct run_result {
  int bad_reads = 0;
  std::uint64_t peak = 0;
  std::uint64_t budget = 0;
  std::uint64_t footprint = 0;
  std::uint64_t least = 0;
  bool planned_later = false;
  std::uint64_t moved = 0;  // bytes copied device <-> host over the planned iterations
  int over_budget = 0;      // iterations whose peak passed the budget in force
  std::vector<iteration_report> reports;
};

/// Called before each iteration (1-based) with the Session, e.g. to change its budget.
using between_iterations = std::function<void(Session&, int iteration)>;

/// Runs `iterations` iterations of `m`; each op's host work checks its inputs and tags its outputs.
run_result run(const random_model& m, session_config cfg, int iterations, const between_iterations& before = {}) {
  Session s(cfg);
  std::vector<tensor_handle> h(m.tensors.size());
  std::vector<std::uint64_t> last_tag(m.tensors.size(), 0);
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    if (m.tensors[i].kind == tensor_kind::activation) continue;
    std::vector<unsigned char> init(m.tensors[i].bytes);
    last_tag[i] = tag(-1 - static_cast<int>(i), 0);
    fill(init.data(), init.size(), last_tag[i]);
    h[i] = s.add_persistent(m.tensors[i].name, m.tensors[i].bytes, m.tensors[i].kind, init.data());
  }
  auto bad = std::make_shared<std::atomic<int>>(0);
  run_result out;
  for (int it = 1; it <= iterations; ++it) {
    if (before) before(s, it);
    s.begin_iteration();
    for (std::size_t k = 0; k < m.ops.size(); ++k) {
      const auto& o = m.ops[k];
      for (int t : o.creates) h[t] = s.add_transient(m.tensors[t].name, m.tensors[t].bytes);
      std::vector<tensor_handle> reads, writes;
      for (int t : o.reads) reads.push_back(h[t]);
      for (int t : o.writes) writes.push_back(h[t]);
      std::vector<std::pair<void*, std::uint64_t>> check, write;
      std::vector<std::uint64_t> expect;
      {
        auto op = s.op(o.name, std::span<const tensor_handle>(reads), std::span<const tensor_handle>(writes));
        for (int t : o.reads) {
          check.emplace_back(op.ptr(h[t]), m.tensors[t].bytes);
          expect.push_back(last_tag[t]);
        }
        const std::uint64_t mine = tag(static_cast<int>(k), it);
        for (int t : o.writes) {
          write.emplace_back(op.ptr(h[t]), m.tensors[t].bytes);
          last_tag[t] = mine;
        }
        op.device().launch_kernel(op.stream(), [check, expect, write, mine, bad] {
          for (std::size_t i = 0; i < check.size(); ++i)
            if (!holds(check[i].first, check[i].second, expect[i])) ++*bad;
          for (auto [p, n] : write) fill(p, n, mine);
        });
      }
      for (int t : o.releases) s.release(h[t]);
    }
    const auto r = s.end_iteration();
    if (r.peak_device_bytes > s.device_budget()) ++out.over_budget;
    out.reports.push_back(r);
    out.peak = std::max(out.peak, r.peak_device_bytes);
    if (it > 1) out.planned_later = out.planned_later || r.planned;
    if (it > 1) out.moved += r.h2d_bytes + r.d2h_bytes;
  }
  // Every persistent tensor reads back with its last writer's pattern.
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    if (m.tensors[i].kind == tensor_kind::activation) continue;
    std::vector<unsigned char> back(m.tensors[i].bytes);
    s.read(h[i], back.data(), back.size());
    if (!holds(back.data(), back.size(), last_tag[i])) ++*bad;
  }
  out.bad_reads = bad->load();
  out.budget = s.device_budget();
  out.footprint = s.footprint_bytes();
  out.least = s.least_budget_bytes();
  return out;
}

session_config base_config(const std::string& policy, std::uint64_t budget) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = 64_MiB;
  c.device_budget = budget;
  c.policy = policy;
  c.link_gbps = 0;
  return c;
}

}  // namespace

TEST(Session, EverythingResidentRunGivesCorrectData) {
  spillway::testing::watchdog dog("EverythingResidentRunGivesCorrectData", std::chrono::seconds(60));
  std::mt19937 rng(spillway::test::test_seed(11));
  const auto m = make_model(rng, 6, 30);
  const auto r = run(m, base_config("none", 0), 3);
  EXPECT_EQ(r.bad_reads, 0);
  EXPECT_EQ(r.budget, 64_MiB) << "no budget given: the cpu device's memory, all free";
  EXPECT_TRUE(r.planned_later);
  EXPECT_GT(r.footprint, 0u);
  EXPECT_LE(r.least, r.footprint);
}

TEST(Session, RandomModelsBudgetsAndPoliciesKeepDataAndBudget) {
  spillway::testing::watchdog dog("RandomModelsBudgetsAndPoliciesKeepDataAndBudget", std::chrono::seconds(240));
  std::mt19937 rng(spillway::test::test_seed(2024));
  for (int trial = 0; trial < 6; ++trial) {
    const auto m = make_model(rng, 4 + static_cast<int>(rng() % 6), 20 + static_cast<int>(rng() % 30));
    // Learn the footprint and the least budget from an everything-resident run.
    const auto ref = run(m, base_config("none", 0), 2);
    ASSERT_EQ(ref.bad_reads, 0);
    for (const char* policy : {"none", "lms", "vdnn", "auto"}) {
      std::uniform_real_distribution<double> frac(0.0, 1.0);
      const std::uint64_t lo = ref.least, hi = std::max(lo, ref.footprint + 64_KiB);
      // The least budget itself, then random ones up to everything resident.
      const auto budget = trial % 3 == 0 ? lo : lo + static_cast<std::uint64_t>(frac(rng) * static_cast<double>(hi - lo));
      SCOPED_TRACE(std::string(policy) + " budget " + std::to_string(budget) + " trial " + std::to_string(trial));
      const auto r = run(m, base_config(policy, budget), 3);
      EXPECT_EQ(r.bad_reads, 0) << "stale or lost data";
      EXPECT_LE(r.peak, budget) << "device bytes past the budget";
      EXPECT_TRUE(r.planned_later);
      for (const auto& it : r.reports) {  // the simulator's step for the plan followed, and only then
        if (it.planned) {
          EXPECT_GT(it.planned_step_ms, 0.0) << "iteration " << it.iteration;
          EXPECT_TRUE(std::isfinite(it.planned_step_ms)) << "iteration " << it.iteration;
        } else {
          EXPECT_EQ(it.planned_step_ms, 0.0) << "iteration " << it.iteration;
        }
      }
      if (budget < ref.least + (ref.footprint - ref.least) / 2) {
        EXPECT_GT(r.moved, 0u) << "a budget well under the footprint moved nothing";
      }
    }
  }
}

// Once a plan runs, every allocation lands at its packed address: nothing is fetched or evicted
// on demand and nothing is refused for fragments, though the budget is well under the footprint.
// (vdnn's plan does not depend on the budget, so a lower planning budget cannot make its packing
// fit; it falls back to best fit and is left out here.)
TEST(Session, FollowedPlansPlaceEveryAllocationByTheLayout) {
  spillway::testing::watchdog dog("FollowedPlansPlaceEveryAllocationByTheLayout", std::chrono::seconds(120));
  std::mt19937 rng(spillway::test::test_seed(77));
  int checked = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const auto m = make_model(rng, 4 + static_cast<int>(rng() % 6), 20 + static_cast<int>(rng() % 30));
    const auto ref = run(m, base_config("none", 0), 2);
    ASSERT_EQ(ref.bad_reads, 0);
    const std::uint64_t budget = ref.least + (ref.footprint - ref.least) / 2 + 32_KiB;
    for (const char* policy : {"lms", "auto"}) {
      SCOPED_TRACE(std::string(policy) + " budget " + std::to_string(budget) + " trial " + std::to_string(trial));
      const auto r = run(m, base_config(policy, budget), 5);
      EXPECT_EQ(r.bad_reads, 0) << "stale or lost data";
      const auto& last = r.reports.back();
      ASSERT_TRUE(last.planned);
      EXPECT_TRUE(last.layout) << "the packed layout did not fit the budget";
      EXPECT_EQ(last.layout_misses, 0u);
      EXPECT_EQ(last.on_demand_fetches, 0u);
      EXPECT_EQ(last.on_demand_evictions, 0u);
      EXPECT_EQ(last.fragmented_allocations, 0u);
      EXPECT_LE(last.peak_device_bytes, budget);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST(Session, BadConfigIsRefusedBeforeWork) {
  auto c = base_config("sometimes", 0);
  EXPECT_THROW(Session{c}, config_error);
  c = base_config("auto", 128_MiB);  // device has 64 MiB
  try {
    Session s(c);
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("128.00 MiB"), std::string::npos) << e.what();
  }
  c = base_config("auto", 0);
  c.nvme.directories = {"/nonexistent/spillway-swap"};
  EXPECT_THROW(Session{c}, error);
}

// ---- I/O errors from the NVMe tier ---------------------------------------------------------------

namespace {
session_config nvme_config(const std::string& dir) {
  auto c = base_config("auto", 0);
  c.host_budget = 4_KiB;  // everything that leaves the device goes to NVMe
  c.nvme.directories = {dir};
  c.nvme.reserve = 64_MiB;
  return c;
}
}  // namespace

TEST(SessionNvme, FailedReadNamesTheTensorAndLosesNothing) {
  spillway::testing::watchdog dog("FailedReadNamesTheTensorAndLosesNothing", std::chrono::seconds(60));
  test::temp_dir dir;
  auto faults = std::make_shared<test::fault_plan>();
  session_hooks hooks;
  hooks.make_io_queue = test::faulty(faults);
  Session s(nvme_config(dir.path()), hooks);
  auto init = test::random_bytes(256_KiB, 5);
  auto w = s.add_persistent("layer3.weight", init.size(), tensor_kind::parameter, init.data());  // on NVMe
  faults->kind = io_kind::read;
  faults->what = test::fault_plan::action::fail;
  faults->first = 1;
  faults->count = 0;
  s.begin_iteration();
  auto out = s.add_transient("out", 4_KiB);
  try {
    auto op = s.op("matmul", {w}, {out});
    FAIL() << "an op ran on a tensor whose read failed";
  } catch (const io_error& e) {
    EXPECT_NE(std::string(e.what()).find("layer3.weight"), std::string::npos) << e.what();
  }
  faults->disarm();
  std::vector<unsigned char> back(init.size());
  s.read(w, back.data(), back.size());
  EXPECT_EQ(back, init) << "the tensor's bytes were lost";
}

TEST(SessionNvme, CorruptedBlockIsCaughtBeforeAnyOpSeesIt) {
  spillway::testing::watchdog dog("CorruptedBlockIsCaughtBeforeAnyOpSeesIt", std::chrono::seconds(60));
  test::temp_dir dir;
  auto faults = std::make_shared<test::fault_plan>();
  faults->kind = io_kind::write;
  faults->what = test::fault_plan::action::corrupt_on_disk;
  faults->first = 1;
  faults->count = 1;
  session_hooks hooks;
  hooks.make_io_queue = test::faulty(faults);
  Session s(nvme_config(dir.path()), hooks);
  auto init = test::random_bytes(100_KiB, 6);
  auto w = s.add_persistent("embedding.table", init.size(), tensor_kind::parameter, init.data());
  s.begin_iteration();
  auto out = s.add_transient("out", 4_KiB);
  std::atomic<bool> ran{false};
  try {
    auto op = s.op("lookup", {w}, {out});
    op.device().launch_kernel(op.stream(), [&] { ran = true; });
    FAIL() << "the corrupted tensor reached an op";
  } catch (const corruption_error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding.table"), std::string::npos) << e.what();
  }
  s.device().synchronize();
  EXPECT_FALSE(ran.load());
}

TEST(SessionNvme, FailedWriteKeepsTheBytesOnTheHostAndSaysWhich) {
  spillway::testing::watchdog dog("FailedWriteKeepsTheBytesOnTheHostAndSaysWhich", std::chrono::seconds(60));
  test::temp_dir dir;
  auto faults = std::make_shared<test::fault_plan>();
  session_hooks hooks;
  hooks.make_io_queue = test::faulty(faults);
  auto cfg = nvme_config(dir.path());
  cfg.cpu_device_memory = 64_MiB;
  cfg.device_budget = 600_KiB;  // two 256 KiB tensors and a little: one must leave
  Session s(cfg, hooks);
  auto a0 = test::random_bytes(256_KiB, 7), b0 = test::random_bytes(256_KiB, 8);
  auto a = s.add_persistent("a", a0.size(), tensor_kind::parameter, a0.data());
  auto b = s.add_persistent("b", b0.size(), tensor_kind::parameter, b0.data());
  auto c = s.add_persistent("c", b0.size(), tensor_kind::parameter, b0.data());
  faults->kind = io_kind::write;
  faults->what = test::fault_plan::action::fail;
  faults->error = ENOSPC;
  faults->first = 1;
  faults->count = 0;
  s.begin_iteration();
  {
    auto op = s.op("scale a", {a}, {a});
    const auto* p = op.ptr<unsigned char>(a);
    (void)p;
    op.device().launch_kernel(op.stream(), [q = op.ptr<unsigned char>(a)] { q[0] ^= 0xFF; });
  }
  { auto op = s.op("touch b", {b}, {}); }
  { auto op = s.op("touch c", {c}, {}); }  // a (changed) must leave: its write fails
  bool reported = false;
  try {
    s.end_iteration();
  } catch (const io_error& e) {
    reported = std::string(e.what()).find("\"a\"") != std::string::npos ||
               std::string(e.what()).find("a#") != std::string::npos;
    EXPECT_TRUE(reported) << e.what();
  }
  EXPECT_TRUE(reported) << "the failed write was not reported";
  faults->disarm();
  auto want = a0;
  want[0] ^= 0xFF;
  std::vector<unsigned char> back(a0.size());
  s.read(a, back.data(), back.size());
  EXPECT_EQ(back, want) << "the changed tensor was lost";
}

// A fixed nvme.reserve smaller than what the plan may keep on NVMe, counted as the tier stores
// tensors (whole 1 MiB blocks: eight 16 KiB tensors take 8 MiB, not 128 KiB), is refused when the
// plan is made, naming the setting and the least reserve, and the tensors keep their values. (The
// plan is edited to send every tensor to NVMe after its op; the recording iteration needs none.)
TEST(SessionNvme, AFixedReserveBelowWhatThePlanKeepsThereIsRefusedWhenThePlanIsMade) {
  spillway::testing::watchdog dog("AFixedReserveBelowWhatThePlanKeepsThere", std::chrono::seconds(60));
  test::temp_dir dir;
  auto cfg = nvme_config(dir.path());
  cfg.nvme.reserve = 4_MiB;
  cfg.host_budget = 0;
  session_hooks hooks;
  hooks.edit_plan = [](const trace& t, plan& p) {
    for (op_index k = 0; k < t.ops.size(); ++k)
      p.steps[k].evictions.push_back(eviction{t.ops[k].writes.at(0), evict_action::evict_to_nvme});
  };
  Session s(cfg, hooks);
  std::vector<tensor_handle> w;
  std::vector<std::vector<unsigned char>> init;
  for (int i = 0; i < 8; ++i) {
    init.push_back(test::random_bytes(16_KiB, 40 + i));
    w.push_back(s.add_persistent("w" + std::to_string(i), 16_KiB, tensor_kind::parameter, init.back().data()));
  }
  std::string refused;
  int ran = 0;
  try {
    for (int it = 0; it < 3; ++it) {
      s.begin_iteration();
      for (int i = 0; i < 8; ++i) {
        auto op = s.op("step" + std::to_string(i), {w[i]}, {w[i]});
        op.device().launch_kernel(op.stream(), [p = op.ptr<unsigned char>(w[i])] { p[0] ^= 1; });
      }
      (void)s.end_iteration();
      ++ran;
    }
  } catch (const config_error& e) {
    refused = e.what();
  }
  ASSERT_FALSE(refused.empty()) << "a plan keeping 8 MiB of blocks on a 4 MiB reserve was taken";
  EXPECT_NE(refused.find("nvme.reserve: 4.00 MiB"), std::string::npos) << refused;
  EXPECT_NE(refused.find("give nvme.reserve of at least 8.00 MiB"), std::string::npos) << refused;
  EXPECT_EQ(ran, 0) << "the plan is made, and refused, as the recording iteration ends";
  // The recording iteration ran whole: each tensor has its first byte flipped once.
  for (int i = 0; i < 8; ++i) {
    std::vector<unsigned char> back(16_KiB);
    s.read(w[i], back.data(), back.size());
    auto want = init[i];
    want[0] ^= 1;
    EXPECT_EQ(back, want) << "w" << i;
  }
}

// set_device_budget between iterations, property style: random models, the first iteration at
// the whole device, then random budgets between the least and the footprint, lower and higher in
// turn. Data is never stale or lost, no iteration passes the budget in force, and the iteration
// after each change follows a plan made for the new budget.
TEST(Session, SetDeviceBudgetBetweenIterationsReplansAndKeepsDataAndBudget) {
  spillway::testing::watchdog dog("SetDeviceBudgetBetweenIterationsReplansAndKeepsDataAndBudget", std::chrono::seconds(240));
  std::mt19937 rng(spillway::test::test_seed(4242));
  for (int trial = 0; trial < 4; ++trial) {
    const auto m = make_model(rng, 4 + static_cast<int>(rng() % 6), 20 + static_cast<int>(rng() % 30));
    for (const char* policy : {"lms", "auto"}) {
      std::vector<std::uint64_t> set;  // the budget set before iteration i + 2
      const auto r = run(m, base_config(policy, 0), 5, [&](Session& s, int it) {
        if (it == 1) return;
        const std::uint64_t lo = s.least_budget_bytes(), hi = s.footprint_bytes() + 64_KiB;
        ASSERT_GT(lo, 0u);
        std::uniform_real_distribution<double> frac(0.0, 1.0);
        const auto b = it == 2 ? lo : lo + static_cast<std::uint64_t>(frac(rng) * static_cast<double>(hi - lo));
        s.set_device_budget(b);
        EXPECT_EQ(s.device_budget(), b);
        ASSERT_NE(s.current_plan(), nullptr);
        EXPECT_LE(s.current_plan()->budget_bytes, b) << "the plan was not made for the new budget";
        set.push_back(b);
      });
      SCOPED_TRACE(std::string(policy) + " trial " + std::to_string(trial));
      EXPECT_EQ(r.bad_reads, 0) << "stale or lost data";
      EXPECT_EQ(r.over_budget, 0) << "an iteration passed the budget in force";
      ASSERT_EQ(set.size(), 4u);
      for (std::size_t i = 0; i < set.size(); ++i) {
        EXPECT_TRUE(r.reports[i + 1].planned) << "iteration " << i + 2;
        EXPECT_LE(r.reports[i + 1].peak_device_bytes, set[i]);
      }
    }
  }
}

// A budget that cannot work is refused, names the value and what would fit, and changes nothing;
// inside an iteration the call itself is a misuse.
TEST(Session, SetDeviceBudgetRefusesWhatCannotWork) {
  Session s(base_config("auto", 0));
  auto w = s.add_persistent("w", 256_KiB, tensor_kind::parameter);
  s.set_device_budget(32_MiB);  // before anything is recorded, any budget the device holds will do
  EXPECT_EQ(s.device_budget(), 32_MiB);
  auto one_iteration = [&](const std::function<void()>& inside = {}) {
    s.begin_iteration();
    auto y = s.add_transient("y", 128_KiB);
    { auto op = s.op("fc.forward", {w}, {y}); }
    if (inside) inside();
    s.release(y);
    (void)s.end_iteration();
  };
  one_iteration();
  const std::uint64_t least = s.least_budget_bytes();
  ASSERT_EQ(least, 384_KiB);
  const std::uint64_t before = s.device_budget();
  try {
    s.set_device_budget(least - 512);
    FAIL() << "a budget below the least was taken";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(least - 512)), std::string::npos) << msg;
    EXPECT_NE(msg.find("384.00 KiB"), std::string::npos) << "does not say what would fit: " << msg;
    EXPECT_EQ(msg.find(" [at "), std::string::npos) << "bad input carries no source location: " << msg;
  }
  try {
    s.set_device_budget(128_MiB);
    FAIL() << "a budget past the device was taken";
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("128.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("give at most 64.00 MiB"), std::string::npos) << msg;
  }
  EXPECT_THROW(s.set_device_budget(0), config_error);
  EXPECT_EQ(s.device_budget(), before) << "a refused budget changed the budget";
  one_iteration([&] { EXPECT_THROW(s.set_device_budget(least), usage_error); });
  s.set_device_budget(least);
  EXPECT_EQ(s.device_budget(), least);
  one_iteration();
  EXPECT_LE(s.history().back().peak_device_bytes, least);
  EXPECT_TRUE(s.history().back().planned);
}

// A budget whose plan the Session cannot hold (it would keep more in the host tier than
// host_budget allows) is refused, and refusing it changes nothing: the budget, the recorded
// trace and the plan stay, and the next iterations follow that plan.
TEST(Session, ABudgetWhosePlanTheHostTierCannotHoldChangesNothing) {
  auto cfg = base_config("lms", 0);
  cfg.host_budget = 300_KiB;  // the weight's copy and little more
  Session s(cfg);
  auto w = s.add_persistent("w", 256_KiB, tensor_kind::parameter);
  auto one_iteration = [&] {
    s.begin_iteration();
    auto y1 = s.add_transient("y1", 128_KiB);
    auto y2 = s.add_transient("y2", 128_KiB);
    { auto op = s.op("a", {w}, {y1}); }
    { auto op = s.op("b", {w}, {y2}); }
    { auto op = s.op("c", {y1, y2}, {}); }
    s.release(y1);
    s.release(y2);
    return s.end_iteration();
  };
  (void)one_iteration();
  ASSERT_TRUE(one_iteration().planned);
  const std::uint64_t before = s.device_budget();
  const std::size_t ops = s.recorded_trace().ops.size();
  // At the least budget y1 must leave the device while b runs, and the host tier has no room.
  try {
    s.set_device_budget(s.least_budget_bytes());
    FAIL() << "a budget whose plan needs more of the host tier than it has was taken";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("host_budget"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.device_budget(), before) << "a refused budget changed the budget";
  EXPECT_EQ(s.recorded_trace().ops.size(), ops) << "a refused budget lost the recorded trace";
  for (int i = 0; i < 2; ++i) {
    iteration_report r;
    ASSERT_NO_THROW(r = one_iteration()) << "iteration " << i << " after the refusal";
    EXPECT_TRUE(r.planned) << "iteration " << i << " after the refusal";
    EXPECT_EQ(r.on_demand_fetches + r.on_demand_evictions, 0u) << "iteration " << i << " did not follow the plan";
  }
}

// Misuse of the API is a usage_error (with a location); bad input is a config_error that names
// the input and says what is right, with no location.
TEST(Session, MisuseIsAUsageErrorAndBadInputAConfigError) {
  Session s(base_config("none", 0));
  auto w = s.add_persistent("w", 4_KiB, tensor_kind::parameter);
  auto config_message = [](auto&& f) {
    try {
      f();
    } catch (const config_error& e) {
      return std::string(e.what());
    }
    return std::string("no config_error");
  };
  for (const auto& msg : {config_message([&] { (void)s.add_persistent("z", 0, tensor_kind::parameter); }),
                          config_message([&] { (void)s.add_persistent("w", 8_KiB, tensor_kind::parameter); }),
                          config_message([&] { (void)s.add_persistent("a", 4_KiB, tensor_kind::activation); }),
                          config_message([&] { (void)s.add_transient("p", 4_KiB, tensor_kind::parameter); })}) {
    EXPECT_EQ(msg.find(" [at "), std::string::npos) << msg;
    EXPECT_NE(msg.find("give"), std::string::npos) << "does not say what is right: " << msg;
  }
  EXPECT_THROW((void)s.op("early", {w}, {}), usage_error);
  EXPECT_THROW(s.read(w, nullptr, 4_KiB), usage_error);  // not a crash in a copy
  EXPECT_THROW(s.write(w, nullptr, 4_KiB), usage_error);
  EXPECT_THROW((void)s.end_iteration(), usage_error);
  EXPECT_THROW((void)s.add_transient("t", 4_KiB), usage_error);
  s.begin_iteration();
  EXPECT_THROW(s.begin_iteration(), usage_error);
  EXPECT_THROW((void)s.op("stray", {tensor_handle{99}}, {}), usage_error);
  {
    auto op = s.op("fc.forward", {w}, {});
    std::vector<char> host(4_KiB);
    EXPECT_THROW(s.read(w, host.data(), host.size()), usage_error);
    EXPECT_THROW((void)s.op("nested", {w}, {}), usage_error);
  }
  try {
    s.begin_iteration();
    FAIL();
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find(" [at "), std::string::npos) << "misuse carries a location: " << e.what();
  }
  (void)s.end_iteration();
  // An op's scope held past the step (kept in a member): the step cannot end, and the next
  // begin_iteration says which op is still open; once the scope goes, the step ends.
  s.begin_iteration();
  std::optional<Session::op_scope> held(s.op("held.forward", {w}, {}));
  EXPECT_THROW((void)s.end_iteration(), usage_error);
  try {
    s.begin_iteration();
    FAIL();
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("op \"held.forward\" of the last iteration is still open"), std::string::npos)
        << e.what();
  }
  held.reset();
  (void)s.end_iteration();
}

// A persistent tensor's name is the tensor: a second add_persistent of it, as a loop gives when
// two layers are both called "weight" or when it creates its optimizer state with a
// get-or-create call each step, is refused instead of sharing the first's memory and
// overwriting its value. State created once, lazily, inside the first step (as PyTorch's Adam
// makes its moments) is kept and updated by every later step, planned ones included.
TEST(Session, APersistentNameRegisteredTwiceIsRefusedAndLosesNothing) {
  for (const char* policy : {"none", "lms", "auto"}) {
    SCOPED_TRACE(policy);
    Session s(base_config(policy, 0));
    const std::vector<float> ones(1024, 1.0f), twos(1024, 2.0f);
    auto w = s.add_persistent("layer.weight", 4_KiB, tensor_kind::parameter, ones.data());
    for (const auto kind : {tensor_kind::parameter, tensor_kind::optimizer_state}) {
      try {
        (void)s.add_persistent("layer.weight", 4_KiB, kind, twos.data());
        ADD_FAILURE() << "a second add of \"layer.weight\" was taken";
      } catch (const config_error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("registered twice"), std::string::npos) << msg;
        EXPECT_NE(msg.find("give each tensor its own name"), std::string::npos) << msg;
        EXPECT_EQ(msg.find("keep the handle") != std::string::npos, kind == tensor_kind::parameter) << msg;
      }
    }
    std::vector<float> out(1024);
    s.read(w, out.data(), 4_KiB);
    EXPECT_EQ(out, ones) << "the refused add changed the first tensor";

    // Adam-like state made inside the first step, then a step that tries to make it again.
    std::optional<tensor_handle> m;
    constexpr int steps = 6;
    for (int step = 0; step < steps; ++step) {
      s.begin_iteration();
      if (!m) m = s.add_persistent("layer.weight.adam_m", 4_KiB, tensor_kind::optimizer_state);
      auto y = s.add_transient("y", 64_KiB);
      { auto op = s.op("forward", {w}, {y});
        op.run([&](const host_access& h) { std::fill_n(h.ptr<float>(y), 16 * 1024, h.ptr<float>(w)[0]); }); }
      { auto op = s.op("adam", {y, *m}, {*m});
        op.run([&](const host_access& h) {
          for (int i = 0; i < 1024; ++i) h.ptr<float>(*m)[i] += h.ptr<float>(y)[i];
        }); }
      s.release(y);
      (void)s.end_iteration();
      if (step == 1) {
        s.set_device_budget(s.least_budget_bytes());
      }
    }
    EXPECT_THROW((void)s.add_persistent("layer.weight.adam_m", 4_KiB, tensor_kind::optimizer_state), config_error);
    s.read(*m, out.data(), 4_KiB);
    EXPECT_EQ(out, std::vector<float>(1024, float{steps})) << "each step added 1 to the state made in the first";
  }
}

// Op scratch (op_scope::workspace): stream-ordered device memory inside the op, counted in the
// budget beside the op's tensors, freed when the scope ends. Random scratch sizes under a tight
// budget: the budget is never passed, scratch never overlaps the op's tensors, and what a kernel
// writes there it reads back. The scratch of one iteration's ops adds up to more than the budget,
// so scratch that outlived its scope would run out. (Each request is at most the budget less the
// op's tensors, divided by their count + 1: a free run that long exists wherever they sit.)
TEST(Session, OpWorkspaceIsCountedInTheBudgetAndFreedAtScopeEnd) {
  spillway::testing::watchdog dog("OpWorkspaceIsCountedInTheBudgetAndFreedAtScopeEnd", std::chrono::seconds(120));
  std::mt19937 rng(spillway::test::test_seed(99));
  const std::uint64_t budget = 160_KiB;
  Session s(base_config("auto", budget));
  std::vector<tensor_handle> w;
  for (int i = 0; i < 6; ++i) w.push_back(s.add_persistent("w" + std::to_string(i), 32_KiB, tensor_kind::parameter));
  auto bad = std::make_shared<std::atomic<int>>(0);
  for (int it = 0; it < 4; ++it) {
    s.begin_iteration();
    std::uint64_t most = 0;
    for (int k = 0; k < 12; ++k) {
      const auto a = w[rng() % w.size()], b = w[rng() % w.size()];
      const std::uint64_t scratch = 16_KiB + rng() % (16_KiB);  // (160 - 2 x 32) / 3 = 32 KiB
      auto op = s.op("fc.forward" + std::to_string(k), {a}, {b});
      auto* p = static_cast<unsigned char*>(op.workspace(scratch));
      auto* pa = op.ptr<unsigned char>(a);
      auto* pb = op.ptr<unsigned char>(b);
      const bool apart = (p + scratch <= pa || pa + 32_KiB <= p) && (p + scratch <= pb || pb + 32_KiB <= p);
      EXPECT_TRUE(apart) << "scratch overlaps a tensor of its op";
      op.device().launch_kernel(op.stream(), [p, scratch, pa, pb, bad] {
        for (std::uint64_t i = 0; i < scratch; ++i) p[i] = static_cast<unsigned char>(i * 7);
        for (std::uint64_t i = 0; i < scratch; ++i)
          if (p[i] != static_cast<unsigned char>(i * 7)) ++*bad;
        if (pa != pb) std::memcpy(pb, pa, 32_KiB);
      });
      most = std::max(most, scratch);
    }
    const auto r = s.end_iteration();
    EXPECT_LE(r.peak_device_bytes, budget) << "iteration " << it;
    EXPECT_GE(r.peak_device_bytes, 32_KiB + most) << "the scratch was not counted";
    EXPECT_LE(s.device_budget(), 12 * 16_KiB) << "the scratch of the iteration's ops must add up to more than the budget";
  }
  EXPECT_EQ(bad->load(), 0);
  // Outside an op there is no scope to hand scratch to; more than the budget cannot be met.
  s.begin_iteration();
  {
    auto op = s.op("fc.forward", {w[0]}, {});
    EXPECT_THROW((void)op.workspace(budget), out_of_memory);
    // Sizes near 2^64 (a failed size query's -1 passed on) wrapped the budget's sums and named
    // a wrong remedy; they are refused as sizes.
    for (const std::uint64_t huge : {~std::uint64_t{0}, ~std::uint64_t{0} - 255, std::uint64_t{1} << 51}) {
      try {
        (void)op.workspace(huge);
        ADD_FAILURE() << huge << " bytes of scratch were given";
      } catch (const config_error& e) {
        EXPECT_NE(std::string(e.what()).find("at most 1 PiB is possible"), std::string::npos) << e.what();
      }
    }
    EXPECT_NE(op.workspace(64_KiB), nullptr) << "the failed request left memory behind";
  }
  (void)s.end_iteration();
}

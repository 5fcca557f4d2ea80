// The executor under plans that are wrong on purpose: prefetches that come too late, evictions of
// what the next op reads, a "drop" of a tensor whose new value exists nowhere else. The data must
// still be right (each op checks its inputs' patterns), with the misses counted as stalls.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

struct rig {
  explicit rig(std::uint64_t budget, double link_bytes_per_s) {
    device_options o;
    o.cpu_device_memory = 64_MiB;
    o.h2d_bytes_per_second = link_bytes_per_s;
    o.d2h_bytes_per_second = link_bytes_per_s;
    dev = std::make_unique<cpu_device>(o);
    executor_stack_options so;
    so.device_budget = budget;
    stack = std::make_unique<executor_stack>(*dev, so);
    exec = &stack->exec();
  }
  std::unique_ptr<cpu_device> dev;
  std::unique_ptr<executor_stack> stack;
  executor* exec = nullptr;
};

void fill(void* p, std::size_t n, unsigned char v) { std::memset(p, v, n); }
bool holds(const void* p, std::size_t n, unsigned char v) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != v) return false;
  return true;
}

}  // namespace

TEST(Executor, WrongPlanStillGivesCorrectDataAndCountsTheMisses) {
  constexpr std::uint64_t n = 256_KiB;
  trace t;
  const auto p0 = t.add_tensor("p0", n, tensor_kind::parameter);
  const auto p1 = t.add_tensor("p1", n, tensor_kind::parameter);
  const auto p2 = t.add_tensor("p2", n, tensor_kind::optimizer_state);
  const auto t0 = t.add_tensor("t0", n, tensor_kind::activation);
  const auto t1 = t.add_tensor("t1", n, tensor_kind::activation);
  t.add_op("op0", {p0}, {t0});
  t.add_op("op1", {p1, t0}, {t1});
  t.add_op("op2", {p2, t1}, {p2});
  t.validate();

  plan bad = plan::empty_for(t, "wrong on purpose", 3 * n);
  bad.initial_tier = {tier::host, tier::host, tier::host, tier::device, tier::device};
  bad.steps[0].evictions.push_back({t0, evict_action::evict_to_host});  // op1 reads it next
  bad.steps[1].prefetches.push_back({p1, tier::host, 1});                // no lead time at all
  bad.steps[2].evictions.push_back({p2, evict_action::drop});            // its new value is only on the device

  rig r(3 * n + 64_KiB, 100e6);  // 256 KiB copies take ~2.6 ms
  const std::vector<tensor_id> ids = {p0, p1, p2, t0, t1};
  for (auto id : ids) r.exec->define(id, t.tensors[id]);
  std::vector<unsigned char> init(n);
  for (auto id : {p0, p1, p2}) {
    fill(init.data(), n, static_cast<unsigned char>(10 + id));
    r.exec->upload(id, init.data());
  }
  r.exec->follow(&t, &bad);

  auto bad_reads = std::make_shared<std::atomic<int>>(0);
  unsigned char p2_value = 12;
  std::uint64_t misses = 0;
  double stall = 0;
  for (int it = 1; it <= 3; ++it) {
    r.exec->begin_iteration();
    auto run_op = [&](op_index k, std::vector<std::pair<tensor_id, unsigned char>> reads,
                      std::vector<std::pair<tensor_id, unsigned char>> writes) {
      std::vector<tensor_id> rs, ws;
      for (auto [id, v] : reads) rs.push_back(id);
      for (auto [id, v] : writes) ws.push_back(id);
      r.exec->begin_op(k, rs, ws, t.ops[k].name);
      std::vector<std::tuple<void*, unsigned char>> checks, outs;
      for (auto [id, v] : reads) checks.emplace_back(r.exec->device_ptr(id), v);
      for (auto [id, v] : writes) outs.emplace_back(r.exec->device_ptr(id), v);
      r.dev->launch_host(r.exec->compute_stream(), [checks, outs, bad_reads, n] {
        for (auto [p, v] : checks)
          if (!holds(p, n, v)) ++*bad_reads;
        for (auto [p, v] : outs) fill(p, n, v);
      });
      r.exec->end_op(k);
    };
    const auto a = static_cast<unsigned char>(100 + it), b = static_cast<unsigned char>(150 + it);
    run_op(0, {{p0, 10}}, {{t0, a}});
    run_op(1, {{p1, 11}, {t0, a}}, {{t1, b}});
    const auto next_p2 = static_cast<unsigned char>(p2_value + 1);
    run_op(2, {{p2, p2_value}, {t1, b}}, {{p2, next_p2}});
    p2_value = next_p2;
    r.exec->release(t0);
    r.exec->release(t1);
    const auto st = r.exec->end_iteration();
    EXPECT_LE(st.peak_device_bytes, 3 * n + 64_KiB);
    misses += st.on_demand_fetches;
    stall += st.stall_ms;
  }
  EXPECT_EQ(bad_reads->load(), 0) << "an op saw stale or lost data";
  EXPECT_GE(misses, 3u) << "the evicted t0 and the unprefetched p0 are fetched on demand every iteration";
  EXPECT_GT(stall, 1.0) << "a prefetch with no lead time over a slow link must stall the op";
  std::vector<unsigned char> back(n);
  r.exec->read(p2, back.data());
  EXPECT_TRUE(holds(back.data(), n, p2_value)) << "the dropped-while-dirty p2 lost its update";
}

TEST(Executor, BudgetBelowAnOpsWorkingSetIsAClearError) {
  constexpr std::uint64_t n = 256_KiB;
  rig r(n + 64_KiB, 0);
  trace t;
  const auto a = t.add_tensor("a", n, tensor_kind::parameter);
  const auto b = t.add_tensor("b", n, tensor_kind::activation);
  r.exec->define(a, t.tensors[a]);
  r.exec->define(b, t.tensors[b]);
  r.exec->upload(a, nullptr);
  r.exec->begin_iteration();
  const std::vector<tensor_id> reads = {a}, writes = {b};
  try {
    r.exec->begin_op(0, reads, writes, "too big");
    FAIL();
  } catch (const out_of_memory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("\"b\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise the device budget"), std::string::npos) << msg;
  }
}

TEST(Executor, ReadBeforeWriteOfATransientIsRefused) {
  rig r(1_MiB, 0);
  r.exec->define(0, tensor_desc{"act", 4096, tensor_kind::activation});
  r.exec->define(1, tensor_desc{"out", 4096, tensor_kind::activation});
  r.exec->begin_iteration();
  const std::vector<tensor_id> reads = {0}, writes = {1};
  EXPECT_THROW(r.exec->begin_op(0, reads, writes, "reads garbage"), config_error);
}

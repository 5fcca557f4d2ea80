// The executor under plans that are wrong on purpose: prefetches that come too late, evictions of
// what the next op reads, a "drop" of a tensor whose new value exists nowhere else. The data must
// still be right (each op checks its inputs' patterns), with the misses counted as stalls.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>

#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"
#include "prefetch/layout.hpp"
#include "../budget_hint.hpp"
#include "patterns.hpp"
#include "../swap/swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;
using spillway::test::fill;
using spillway::test::holds;

namespace {

struct rig {
  /// `nvme_dir`, where given, adds an NVMe tier with its swap file there.
  explicit rig(std::uint64_t budget, double link_bytes_per_s, bool timeline = false, const std::string& nvme_dir = {}) {
    device_options o;  // the strict cpu backend: every rule on
    o.cpu_device_memory = 64_MiB;
    o.h2d_bytes_per_second = link_bytes_per_s;
    o.d2h_bytes_per_second = link_bytes_per_s;
    dev = std::make_unique<cpu_device>(o);
    executor_stack_options so;
    so.device_budget = budget;
    so.timeline = timeline;
    if (!nvme_dir.empty()) {
      nvme_options no;
      no.directories = {nvme_dir};
      no.reserve = 32_MiB;
      so.nvme = no;
    }
    stack = std::make_unique<executor_stack>(*dev, so);
    exec = &stack->exec();
  }
  std::unique_ptr<cpu_device> dev;
  std::unique_ptr<executor_stack> stack;
  executor* exec = nullptr;
};


using values = std::vector<std::pair<tensor_id, unsigned char>>;

/// Runs op k of `t` as a kernel on the compute stream (launch_kernel: the stream's own worker,
/// as on a GPU): it checks that each read tensor holds its value, fills each written one with
/// its value, and takes at least `busy` of device time.
void run_op(rig& r, const trace& t, op_index k, const values& reads, const values& writes,
            const std::shared_ptr<std::atomic<int>>& bad_reads, std::chrono::microseconds busy = {}) {
  std::vector<tensor_id> rs, ws;
  for (auto [id, v] : reads) rs.push_back(id);
  for (auto [id, v] : writes) ws.push_back(id);
  r.exec->begin_op(k, rs, ws, t.ops[k].name);
  std::vector<std::tuple<void*, std::size_t, unsigned char>> checks, outs;
  for (auto [id, v] : reads) checks.emplace_back(r.exec->device_ptr(id), t.tensors[id].bytes, v);
  for (auto [id, v] : writes) outs.emplace_back(r.exec->device_ptr(id), t.tensors[id].bytes, v);
  r.dev->launch_kernel(r.exec->compute_stream(), [checks, outs, bad_reads, busy] {
    const auto until = std::chrono::steady_clock::now() + busy;
    for (auto [p, n, v] : checks)
      if (!holds(p, n, v)) ++*bad_reads;
    for (auto [p, n, v] : outs) fill(p, n, v);
    std::this_thread::sleep_until(until);
  });
  r.exec->end_op(k);
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
    const auto a = static_cast<unsigned char>(100 + it), b = static_cast<unsigned char>(150 + it);
    run_op(r, t, 0, {{p0, 10}}, {{t0, a}}, bad_reads);
    run_op(r, t, 1, {{p1, 11}, {t0, a}}, {{t1, b}}, bad_reads);
    const auto next_p2 = static_cast<unsigned char>(p2_value + 1);
    run_op(r, t, 2, {{p2, p2_value}, {t1, b}}, {{p2, next_p2}}, bad_reads);
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

// Note [Transients live until release]: a plan made from a shorter iteration (an eval pass)
// drops t0 after its last use there; the program departs and reads t0 again later, and under a
// budget that forces t0 out before that read. The drop must not discard the only copy.
TEST(Executor, APlannedDropNeverDiscardsATransientBeforeItsRelease) {
  constexpr std::uint64_t n = 256_KiB;
  trace eval;
  const auto p0 = eval.add_tensor("p0", n, tensor_kind::parameter);
  const auto t0 = eval.add_tensor("t0", n, tensor_kind::activation);
  const auto t1 = eval.add_tensor("t1", n, tensor_kind::activation);
  eval.add_op("fwd0", {p0}, {t0});
  eval.add_op("fwd1", {t0}, {t1});
  eval.validate();
  plan p = plan::empty_for(eval, "drops after the last use in the eval trace", 3 * n);
  p.steps[1].evictions.push_back({t0, evict_action::drop});
  p.steps[1].evictions.push_back({t1, evict_action::drop});

  rig r(3 * n + 64_KiB, 0);
  for (tensor_id id : {p0, t0, t1}) r.exec->define(id, eval.tensors[id]);
  const auto t2 = static_cast<tensor_id>(3);
  r.exec->define(t2, tensor_desc{"t2", n, tensor_kind::activation});
  std::vector<unsigned char> init(n, 7);
  r.exec->upload(p0, init.data());
  r.exec->follow(&eval, &p);

  trace train = eval;  // what the program does: the eval ops, then a backward that reads t0
  train.add_tensor("t2", n, tensor_kind::activation);
  train.add_op("fwd2", {t1, p0}, {t2});   // p0, t1, t2: t0 must leave the device here
  train.add_op("bwd0", {t0, p0}, {p0});
  auto bad_reads = std::make_shared<std::atomic<int>>(0);
  for (int it = 1; it <= 2; ++it) {
    r.exec->begin_iteration();
    const auto v = static_cast<unsigned char>(7 + 3 * (it - 1));
    run_op(r, train, 0, {{p0, v}}, {{t0, 50}}, bad_reads);
    run_op(r, train, 1, {{t0, 50}}, {{t1, 60}}, bad_reads);  // the plan says drop t0 and t1 here
    r.exec->abandon_plan();                                   // the program departs from the eval trace
    run_op(r, train, 2, {{t1, 60}, {p0, v}}, {{t2, 70}}, bad_reads);
    r.exec->release(t1);
    r.exec->release(t2);
    ASSERT_NO_THROW(run_op(r, train, 3, {{t0, 50}, {p0, v}}, {{p0, static_cast<unsigned char>(v + 3)}}, bad_reads))
        << "iteration " << it;
    r.exec->release(t0);
    const auto st = r.exec->end_iteration();
    EXPECT_LE(st.peak_device_bytes, 3 * n + 64_KiB);
  }
  EXPECT_EQ(bad_reads->load(), 0) << "an op saw a lost value";
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

// The budget the error asks for is enough for the op, where what the op needs is no whole
// number of hundredths of a MiB (the message rounds up and gives the bytes).
TEST(Executor, TheBudgetTheErrorAsksForRunsTheOp) {
  constexpr std::uint64_t na = 1_MiB + 1000, nb = 1_MiB + 200_KiB + 7;
  trace t;
  const auto a = t.add_tensor("a", na, tensor_kind::parameter);
  const auto b = t.add_tensor("b", nb, tensor_kind::activation);
  const std::vector<tensor_id> reads = {a}, writes = {b};
  std::string msg;
  {
    rig r(na + 64_KiB, 0);
    r.exec->define(a, t.tensors[a]);
    r.exec->define(b, t.tensors[b]);
    r.exec->upload(a, nullptr);
    r.exec->begin_iteration();
    try {
      r.exec->begin_op(0, reads, writes, "too big");
      FAIL();
    } catch (const out_of_memory& e) {
      msg = e.what();
    }
  }
  const auto hint = spillway::test::read_budget_hint(msg);
  ASSERT_TRUE(hint) << msg;
  ASSERT_TRUE(hint->bytes) << "sizes that round should come with their bytes: " << msg;
  const std::uint64_t need = *hint->bytes;
  EXPECT_GE(need, na + nb);
  EXPECT_GE(std::stod(hint->shown) * 0x1p20, static_cast<double>(need)) << "rounded up: " << msg;
  rig r(need, 0);
  r.exec->define(a, t.tensors[a]);
  r.exec->define(b, t.tensors[b]);
  r.exec->upload(a, nullptr);
  r.exec->begin_iteration();
  r.exec->begin_op(0, reads, writes, "fits");
  r.exec->end_op(0);
  r.exec->release(b);
  r.exec->end_iteration();
}

TEST(Executor, ReadBeforeWriteOfATransientIsRefused) {
  rig r(1_MiB, 0);
  r.exec->define(0, tensor_desc{"act", 4096, tensor_kind::activation});
  r.exec->define(1, tensor_desc{"out", 4096, tensor_kind::activation});
  r.exec->begin_iteration();
  const std::vector<tensor_id> reads = {0}, writes = {1};
  EXPECT_THROW(r.exec->begin_op(0, reads, writes, "reads garbage"), usage_error);
}

namespace {
// Three ops over two parameters and two activations, with a plan that swaps on every op: p0
// leaves after op0 and comes back for op2, a0 leaves after op1 (op2 reads it again), p1 is
// prefetched at op0 for op1.
struct swapping_model {
  explicit swapping_model(tier to) {
    p0 = t.add_tensor("p0", n, tensor_kind::parameter);
    p1 = t.add_tensor("p1", n, tensor_kind::parameter);
    a0 = t.add_tensor("a0", n, tensor_kind::activation);
    a1 = t.add_tensor("a1", n, tensor_kind::activation);
    t.add_op("op0", {p0}, {a0});
    t.add_op("op1", {p1, a0}, {a1});
    t.add_op("op2", {p0, a0, a1}, {p0});
    t.validate();
    p = plan::empty_for(t, "swaps on every op", 4 * n);
    p.initial_tier = {to, to, tier::device, tier::device};
    const auto away = to == tier::nvme ? evict_action::evict_to_nvme : evict_action::evict_to_host;
    p.steps[0].prefetches.push_back({p1, to, 1});
    p.steps[0].evictions.push_back({p0, away});
    p.steps[1].evictions.push_back({a0, away});
    p.steps[1].prefetches.push_back({p0, to, 2});
    p.steps[1].prefetches.push_back({a0, to, 2});
    p.steps[2].evictions.push_back({p0, away});
    p.steps[2].evictions.push_back({p1, away});
    p.validate(t);
  }
  void define(rig& r, tier to) {
    for (tensor_id id = 0; id < t.tensors.size(); ++id) r.exec->define(id, t.tensors[id]);
    std::vector<unsigned char> init(n);
    for (auto id : {p0, p1}) {
      fill(init.data(), n, static_cast<unsigned char>(10 + id));
      r.exec->upload(id, init.data(), to);
    }
    r.exec->follow(&t, &p);
  }
  // One iteration; op2 bumps p0's value.
  executor_stats iterate(rig& r, int it, const std::shared_ptr<std::atomic<int>>& bad, std::chrono::microseconds busy) {
    r.exec->begin_iteration();
    const auto a = static_cast<unsigned char>(100 + it), b = static_cast<unsigned char>(150 + it);
    run_op(r, t, 0, {{p0, p0_value}}, {{a0, a}}, bad, busy);
    run_op(r, t, 1, {{p1, 11}, {a0, a}}, {{a1, b}}, bad, busy);
    const auto next = static_cast<unsigned char>(p0_value + 1);
    run_op(r, t, 2, {{p0, p0_value}, {a0, a}, {a1, b}}, {{p0, next}}, bad, busy);
    p0_value = next;
    r.exec->release(a0);
    r.exec->release(a1);
    return r.exec->end_iteration();
  }
  static constexpr std::uint64_t n = 256_KiB;
  trace t;
  plan p;
  tensor_id p0 = 0, p1 = 0, a0 = 0, a1 = 0;
  unsigned char p0_value = 10;
};
}  // namespace

// Timing is read from timing events after the iteration (Note [Timing events]): on a GPU a host
// function per op would be a driver round trip that keeps kernels from running back to back.
TEST(Executor, ATimedIterationPutsNoHostFunctionOnAnyStream) {
  swapping_model m(tier::host);
  rig r(4 * m.n, 200e6, /*timeline=*/true);
  m.define(r, tier::host);
  r.exec->set_timing(true);
  auto bad = std::make_shared<std::atomic<int>>(0);
  constexpr auto busy = std::chrono::milliseconds(3);
  for (int it = 1; it <= 3; ++it) {
    const auto before = r.dev->counters();
    const auto st = m.iterate(r, it, bad, busy);
    EXPECT_EQ(r.dev->counters().host_functions, before.host_functions) << "iteration " << it;
    EXPECT_EQ(r.dev->counters().kernels, before.kernels + 3);
    ASSERT_EQ(st.op_ms.size(), 3u);
    for (double ms : st.op_ms) {
      EXPECT_GE(ms, 2.9) << "an op took at least 3 ms on the device";
      EXPECT_LT(ms, 1000.0);
    }
    EXPECT_GE(st.stall_ms, 0.0);
    EXPECT_GT(st.h2d_bytes, 0u);
    EXPECT_GT(st.d2h_bytes, 0u);
  }
  EXPECT_EQ(bad->load(), 0) << "an op saw stale or lost data";
  // The timeline is on the executor's clock, in stream order on the compute track.
  double last_end = 0;
  int ops = 0, copies = 0;
  for (const auto& item : r.exec->timeline()) {
    EXPECT_GE(item.start_us, 0.0) << item.name;
    EXPECT_GE(item.end_us, item.start_us) << item.name;
    if (item.where == timeline_item::track::compute) {
      EXPECT_GE(item.start_us, last_end - 1.0) << item.name << " overlaps the op before it on the compute stream";
      EXPECT_GE(item.end_us - item.start_us, 2900.0) << item.name;
      last_end = item.end_us;
      ++ops;
    } else {
      ++copies;
    }
  }
  EXPECT_EQ(ops, 9);
  EXPECT_GT(copies, 0);
  r.dev->synchronize();  // no strict rule was broken
}

// Through the NVMe tier under a slow link: loads are read, then copied by the read's completion,
// and each op waits for the copy's own event; nothing waits in a host function.
TEST(Executor, APlanThroughTheNvmeTierUsesNoHostFunction) {
  test::temp_dir dir;
  swapping_model m(tier::nvme);
  rig r(4 * m.n, 50e6, /*timeline=*/true, dir.path());  // 256 KiB copies take ~5 ms
  m.define(r, tier::nvme);
  auto bad = std::make_shared<std::atomic<int>>(0);
  const auto before = r.dev->counters();
  std::uint64_t read_bytes = 0, write_bytes = 0;
  for (int it = 1; it <= 3; ++it) {
    const auto st = m.iterate(r, it, bad, std::chrono::microseconds(500));
    read_bytes += st.nvme_read_bytes;
    write_bytes += st.nvme_write_bytes;
  }
  EXPECT_EQ(r.dev->counters().host_functions, before.host_functions);
  EXPECT_EQ(bad->load(), 0) << "an op ran before its tensor's H2D copy from NVMe landed";
  EXPECT_GT(read_bytes, 0u);
  EXPECT_GT(write_bytes, 0u);
  std::vector<unsigned char> back(m.n);
  r.exec->read(m.p0, back.data());
  EXPECT_TRUE(holds(back.data(), m.n, m.p0_value)) << "p0 lost an update on its way through NVMe";
  // Each load's copy span ends before the mark the iteration's end waits for, so every span it
  // times was reached (timing one that was not is an error on a GPU, and here).
  int loads = 0;
  for (const auto& item : r.exec->timeline()) {
    if (item.where != timeline_item::track::h2d) continue;
    EXPECT_GE(item.end_us, item.start_us) << item.name;
    ++loads;
  }
  EXPECT_GT(loads, 0) << "no copy from NVMe on the timeline";
  r.dev->synchronize();
}

// Misuse of the executor's API is a usage_error; a tensor of 0 bytes is bad input.
TEST(Executor, MisuseIsAUsageError) {
  rig r(1_MiB, 0);
  EXPECT_THROW(r.exec->define(0, tensor_desc{"empty", 0, tensor_kind::activation}), config_error);
  r.exec->define(0, tensor_desc{"w", 4096, tensor_kind::parameter});
  r.exec->upload(0, nullptr);
  const std::vector<tensor_id> reads = {0}, none;
  EXPECT_THROW(r.exec->begin_op(0, reads, none, "early"), usage_error);
  EXPECT_THROW((void)r.exec->end_iteration(), usage_error);
  EXPECT_THROW(r.exec->release(0), usage_error) << "a persistent tensor was released";
  EXPECT_THROW((void)r.exec->device_ptr(7), usage_error);
  r.exec->begin_iteration();
  EXPECT_THROW(r.exec->begin_iteration(), usage_error);
  EXPECT_THROW((void)r.exec->scratch(512), usage_error) << "scratch outside an op";
  EXPECT_THROW(r.exec->leave_device(), usage_error) << "leave_device inside an iteration";
  r.exec->begin_op(0, reads, none, "op");
  EXPECT_THROW(r.exec->begin_op(1, reads, none, "nested"), usage_error);
  r.exec->end_op(0);
  (void)r.exec->end_iteration();
}

// Scratch is counted with the op's tensors while the op runs and is gone when it ends; when the
// op's tensors and scratch exceed the budget, the error says how much budget would do.
TEST(Executor, ScratchCountsInTheBudgetUntilTheOpEnds) {
  rig r(256_KiB, 0);
  r.exec->define(0, tensor_desc{"w", 96_KiB, tensor_kind::parameter});
  r.exec->define(1, tensor_desc{"v", 96_KiB, tensor_kind::parameter});
  r.exec->upload(0, nullptr);
  r.exec->upload(1, nullptr);
  const std::vector<tensor_id> w = {0}, v = {1}, none;
  r.exec->begin_iteration();
  r.exec->begin_op(0, w, none, "first");
  void* s = r.exec->scratch(128_KiB);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(r.exec->device_bytes_in_use(), 224_KiB);
  r.exec->end_op(0);
  EXPECT_EQ(r.exec->device_bytes_in_use(), 96_KiB) << "scratch outlived its op";
  r.exec->begin_op(1, v, none, "second");  // w may stay: 192 KiB in use
  (void)r.exec->scratch(96_KiB);           // w leaves to make room
  EXPECT_EQ(r.exec->device_bytes_in_use(), 192_KiB);
  try {
    (void)r.exec->scratch(128_KiB);
    FAIL() << "scratch past the budget was given";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("they need 320.00 KiB in all"), std::string::npos) << e.what();
  }
  r.exec->end_op(1);
  const auto st = r.exec->end_iteration();
  EXPECT_LE(st.peak_device_bytes, 256_KiB);
  EXPECT_EQ(st.on_demand_evictions, 1u);
  EXPECT_EQ(st.op_scratch_peak_bytes, 128_KiB) << "the most scratch one op held: the first op's";
}

// A layout that puts an op's four tensors 40 KiB apart in a 160 KiB budget leaves no free run of
// 64 KiB. Scratch asked for with the op (begin_op's scratch) is placed with its tensors: the free
// memory is made whole and they go in best fit. Asked for after the op began, when the owner may
// hold the tensors' pointers, it cannot be: the error says the budget has room, but in pieces,
// and what to do.
TEST(Executor, ScratchAskedForWithTheOpIsPlacedWhereTheLayoutSplitTheMemory) {
  trace t;
  std::vector<tensor_id> parts;
  for (int i = 0; i < 4; ++i) parts.push_back(t.add_tensor("p" + std::to_string(i), 16_KiB, tensor_kind::parameter));
  t.add_op("gather", parts, {});
  t.validate();
  plan p = plan::empty_for(t, "spread", 160_KiB);
  p.initial_tier.assign(4, tier::host);
  device_layout spread;
  for (tensor_id id = 0; id < 4; ++id)
    spread.offsets[static_cast<std::uint64_t>(id) << 32 | layout_slot::place(0)] = id * 40_KiB;
  spread.extent = 136_KiB;
  for (bool with_op : {true, false}) {
    SCOPED_TRACE(with_op ? "scratch asked for with the op" : "scratch asked for inside the op");
    rig r(160_KiB, 0);
    for (tensor_id id = 0; id < 4; ++id) {
      r.exec->define(id, t.tensors[id]);
      std::vector<unsigned char> v(16_KiB, static_cast<unsigned char>(id + 1));
      r.exec->upload(id, v.data());
    }
    r.exec->follow(&t, &p, &spread);
    r.exec->begin_iteration();
    const std::vector<std::uint64_t> want = {64_KiB};
    if (with_op) {
      const auto got = r.exec->begin_op(0, parts, {}, "gather", want);
      ASSERT_EQ(got.size(), 1u);
      auto* out = static_cast<unsigned char*>(got[0]);
      std::vector<const unsigned char*> in;
      for (auto id : parts) in.push_back(static_cast<const unsigned char*>(r.exec->device_ptr(id)));
      r.dev->launch_kernel(r.exec->compute_stream(), [out, in] {
        for (std::size_t i = 0; i < 4; ++i) std::memcpy(out + i * 16_KiB, in[i], 16_KiB);
      });
      std::vector<unsigned char> back(64_KiB);
      r.dev->synchronize_stream(r.exec->compute_stream());
      std::memcpy(back.data(), out, back.size());
      for (std::size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], i / 16_KiB + 1) << "byte " << i;
      EXPECT_EQ(r.exec->device_bytes_in_use(), 128_KiB);
    } else {
      r.exec->begin_op(0, parts, {}, "gather");
      try {
        (void)r.exec->scratch(64_KiB);
        FAIL() << "scratch was placed although the layout left no run of 64 KiB";
      } catch (const out_of_memory& e) {
        EXPECT_NE(std::string(e.what()).find("not in one piece"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("when the op begins"), std::string::npos) << e.what();
      }
    }
    r.exec->end_op(0);
    EXPECT_EQ(r.exec->device_bytes_in_use(), 64_KiB) << "the scratch outlived its op";
    (void)r.exec->end_iteration();
  }
}

// leave_device and a new budget through the stack: every tensor leaves for its tier with its
// value, the arena is reserved again, and the next iteration runs within the new budget.
TEST(Executor, NewBudgetBetweenIterationsKeepsEveryValue) {
  rig r(1_MiB, 0);
  std::vector<unsigned char> a(96_KiB, 0x3c), back(96_KiB, 0);
  r.exec->define(0, tensor_desc{"a", a.size(), tensor_kind::parameter});
  r.exec->define(1, tensor_desc{"b", a.size(), tensor_kind::parameter});
  r.exec->upload(0, a.data());
  r.exec->upload(1, nullptr);
  const std::vector<tensor_id> reads = {0}, writes = {1};
  auto iterate = [&] {
    r.exec->begin_iteration();
    r.exec->begin_op(0, reads, writes, "copy");
    auto* src = static_cast<unsigned char*>(r.exec->device_ptr(0));
    auto* dst = static_cast<unsigned char*>(r.exec->device_ptr(1));
    r.dev->launch_kernel(r.exec->compute_stream(), [src, dst] { for (std::size_t i = 0; i < 96_KiB; ++i) dst[i] = src[i] + 1; });
    r.exec->end_op(0);
    return r.exec->end_iteration();
  };
  (void)iterate();
  ASSERT_GT(r.exec->device_bytes_in_use(), 0u) << "nothing stayed on the device to leave";
  r.stack->set_device_budget(device_budget(200_KiB));
  EXPECT_EQ(r.exec->device_bytes_in_use(), 0u);
  EXPECT_EQ(r.exec->budget().bytes(), 200_KiB);
  EXPECT_EQ(r.stack->memory().capacity(), 200_KiB);
  r.exec->read(1, back.data());
  EXPECT_EQ(back[0], 0x3d) << "b's value was lost leaving the device";
  EXPECT_THROW(r.stack->set_device_budget(device_budget(128_MiB)), config_error);
  EXPECT_EQ(r.exec->budget().bytes(), 200_KiB);
  const auto st = iterate();
  EXPECT_LE(st.peak_device_bytes, 200_KiB);
  r.exec->read(1, back.data());
  EXPECT_EQ(back[95_KiB], 0x3d);
}

// begin_iteration starts copying in the parameters the plan starts on the device; a host read
// right after must wait for that copy, not read the device block while it is still landing.
TEST(Executor, AReadRightAfterTheIterationsFirstPrefetchesWaitsForThem) {
  constexpr std::uint64_t n = 4_MiB;
  trace t;
  const auto p = t.add_tensor("p", n, tensor_kind::parameter);
  const auto y = t.add_tensor("y", n, tensor_kind::activation);
  t.add_op("op0", {p}, {y});
  t.validate();
  plan starts_resident = plan::empty_for(t, "p starts on the device", 2 * n);
  starts_resident.initial_tier = {tier::device, tier::device};

  rig r(2 * n + 64_KiB, 50e6);  // 4 MiB take about 80 ms to land
  r.exec->define(p, t.tensors[p]);
  r.exec->define(y, t.tensors[y]);
  std::vector<unsigned char> init(n, 0x5a), back(n, 0);
  r.exec->upload(p, init.data());
  r.exec->follow(&t, &starts_resident);
  r.exec->begin_iteration();
  ASSERT_GT(r.exec->device_bytes_in_use(), 0u) << "begin_iteration fetched nothing: the test checks nothing";
  r.exec->read(p, back.data());
  EXPECT_TRUE(holds(back.data(), n, 0x5a)) << "the read saw the device block before its copy landed";
  auto bad_reads = std::make_shared<std::atomic<int>>(0);
  run_op(r, t, 0, {{p, 0x5a}}, {{y, 1}}, bad_reads);
  r.exec->release(y);
  (void)r.exec->end_iteration();
  EXPECT_EQ(bad_reads->load(), 0);
}

// A tier copy goes stale when an op writes the tensor, and one of a transient when it is
// released: both give their host-tier bytes back, or the host tier fills up over the iterations.
TEST(Executor, StaleAndReleasedTierCopiesGiveTheirHostBytesBack) {
  constexpr std::uint64_t n = 1_MiB;
  trace t;
  const auto m = t.add_tensor("m", n, tensor_kind::optimizer_state);
  const auto y = t.add_tensor("y", n, tensor_kind::activation);
  t.add_op("update", {m}, {m, y});
  t.add_op("use", {y}, {});
  t.validate();
  plan resident = plan::empty_for(t, "m starts on the device", 2 * n);
  resident.initial_tier = {tier::device, tier::device};
  resident.steps[0].evictions.push_back({y, evict_action::evict_to_host});

  rig r(4 * n, 0);
  r.exec->define(m, t.tensors[m]);
  r.exec->define(y, t.tensors[y]);
  std::vector<unsigned char> init(n, 7);
  r.exec->upload(m, init.data());
  r.exec->follow(&t, &resident);
  auto bad_reads = std::make_shared<std::atomic<int>>(0);
  for (int it = 0; it < 3; ++it) {
    r.exec->begin_iteration();
    const auto v = static_cast<unsigned char>(7 + it);
    run_op(r, t, 0, {{m, v}}, {{m, static_cast<unsigned char>(v + 1)}, {y, 40}}, bad_reads);
    run_op(r, t, 1, {{y, 40}}, {}, bad_reads);
    r.exec->release(y);
    (void)r.exec->end_iteration();
    r.stack->pool().release_unused();
    EXPECT_EQ(r.stack->pool().stats().allocated_bytes, 0u)
        << "iteration " << it << ": a stale or released tier copy still holds host memory";
  }
  EXPECT_EQ(bad_reads->load(), 0);
}

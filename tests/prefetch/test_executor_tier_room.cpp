// The executor when the host tier is full: which tier copies it lets go to make room (Note
// [Redundant tier copies] in prefetch/executor.cpp), and which it must keep because they hold a
// tensor's only value.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"
#include "patterns.hpp"

using namespace spillway;
using namespace spillway::literals;
using spillway::test::fill;
using spillway::test::holds;

namespace {

/// The strict cpu backend and an executor with a device budget and a host tier of the sizes
/// given; the link's rates in bytes/s (0: unlimited).
struct tier_rig {
  tier_rig(std::uint64_t device_budget, std::uint64_t host_budget, double h2d = 0, double d2h = 0)
      : dev(device(h2d, d2h)), stack(dev, stack_options(device_budget, host_budget)), ex(stack.exec()) {}
  static device_options device(double h2d, double d2h) {
    device_options o;
    o.cpu_device_memory = 64_MiB;
    o.h2d_bytes_per_second = h2d;
    o.d2h_bytes_per_second = d2h;
    return o;
  }
  static executor_stack_options stack_options(std::uint64_t device_budget, std::uint64_t host_budget) {
    executor_stack_options so;
    so.device_budget = device_budget;
    so.host_budget = host_budget;
    return so;
  }
  cpu_device dev;
  executor_stack stack;
  executor& ex;
};

}  // namespace

// A transient swapped out and back, which the plan drops at its last use and the program
// releases right after, gives its tier copy back at the drop: the op's own copy out finds the
// host bytes the simulator counted free. Here the host tier holds one tensor; kept until the
// release, y's copy left no room for z's, and a plan judged to fit the tier ran out of it. Its
// device copy stays until release(), so a program that reads it once more first still finds it.
TEST(Executor, ATransientDroppedAtItsLastUseGivesItsTierCopyBackBeforeTheOpsCopiesOut) {
  constexpr std::uint64_t n = 1_MiB;
  trace t;
  const auto m = t.add_tensor("m", n, tensor_kind::parameter);
  const auto y = t.add_tensor("y", n, tensor_kind::activation);
  const auto z = t.add_tensor("z", n, tensor_kind::activation);
  t.add_op("fwd", {m}, {y});
  t.add_op("mid", {m}, {});
  t.add_op("bwd", {y}, {z});
  t.add_op("use", {z}, {});
  t.validate();
  plan p = plan::empty_for(t, "y out and back, z out and back", 3 * n);
  p.initial_tier = {tier::device, tier::device, tier::device};
  p.steps[0].evictions.push_back({y, evict_action::evict_to_host});
  p.steps[2].prefetches.push_back({y, tier::host, 2});
  p.steps[2].evictions.push_back({y, evict_action::drop});
  p.steps[2].evictions.push_back({z, evict_action::evict_to_host});
  p.steps[3].prefetches.push_back({z, tier::host, 3});

  tier_rig rig(4 * n, n);
  auto& dev = rig.dev;
  executor& ex = rig.ex;
  for (tensor_id id : {m, y, z}) ex.define(id, t.tensors[id]);
  ex.upload(m, nullptr);
  auto bad_reads = std::make_shared<std::atomic<int>>(0);
  for (int it = 0; it < 3; ++it) {
    if (it == 1) ex.follow(&t, &p);  // the first iteration, unplanned, shows where y is released
    ex.begin_iteration();
    const auto v = static_cast<unsigned char>(40 + it);
    std::vector<tensor_id> none, ms = {m}, ys = {y}, zs = {z};
    (void)ex.begin_op(0, ms, ys, "fwd");
    dev.launch_kernel(ex.compute_stream(), [yp = ex.device_ptr(y), v] { fill(yp, n, v); });
    ex.end_op(0);
    (void)ex.begin_op(1, ms, none, "mid");
    ex.end_op(1);
    (void)ex.begin_op(2, ys, zs, "bwd");
    dev.launch_kernel(ex.compute_stream(), [yp = ex.device_ptr(y), zp = ex.device_ptr(z), v, bad_reads] {
      if (!holds(yp, n, v)) ++*bad_reads;
      fill(zp, n, static_cast<unsigned char>(v + 1));
    });
    ASSERT_NO_THROW(ex.end_op(2)) << "iteration " << it << ": z found no room in the host tier";
    std::vector<tensor_id> last = zs;
    if (it == 2) {  // the program departs: its last op reads y too, before y's release
      ex.abandon_plan();
      last.push_back(y);
    } else {
      ex.release(y);
    }
    (void)ex.begin_op(3, last, none, "use");
    dev.launch_kernel(ex.compute_stream(), [zp = ex.device_ptr(z), yp = it == 2 ? ex.device_ptr(y) : nullptr, v, bad_reads] {
      if (!holds(zp, n, static_cast<unsigned char>(v + 1))) ++*bad_reads;
      if (yp != nullptr && !holds(yp, n, v)) ++*bad_reads;
    });
    ex.end_op(3);
    if (it == 2) ex.release(y);
    ex.release(z);
    const auto st = ex.end_iteration();
    if (it == 1) {
      EXPECT_EQ(st.on_demand_fetches + st.on_demand_evictions, 0u) << "the plan was not followed";
    }
  }
  EXPECT_EQ(bad_reads->load(), 0) << "an op saw a lost value";
}

// The executor lets redundant tier copies go when the host tier is full (Note [Redundant tier
// copies]). A tensor whose load is still on the link is not one of them: its device bytes are
// not there yet, so a copy out of them would save garbage for the only value the tensor has.
// Here a2's load (1 MiB at 10 MB/s: 100 ms) is under way when the save of b, which
// finds the tier full, lets c's and d's copies go; a plan that evicts a2 right after then must
// still keep a2's value.
TEST(Executor, ATensorWhoseLoadIsOnTheLinkKeepsItsTierCopyWhenTheTierIsFull) {
  constexpr std::uint64_t n = 1_MiB;
  trace t;
  const auto c = t.add_tensor("c", n, tensor_kind::parameter);
  const auto d = t.add_tensor("d", n, tensor_kind::parameter);
  const auto a2 = t.add_tensor("a2", n, tensor_kind::parameter);
  const auto b = t.add_tensor("b", n / 4, tensor_kind::activation);
  t.add_op("fwd", {c, d}, {b});
  t.add_op("mid", {b}, {});
  t.add_op("use", {a2}, {});
  t.validate();
  plan p = plan::empty_for(t, "a2 loads early and leaves again", 4 * n);
  p.initial_tier = {tier::device, tier::device, tier::host, tier::device};
  p.steps[0].prefetches.push_back({a2, tier::host, 2});
  p.steps[0].evictions.push_back({b, evict_action::evict_to_host});
  p.steps[0].evictions.push_back({a2, evict_action::evict_to_host});
  p.steps[1].prefetches.push_back({b, tier::host, 1});
  p.steps[2].prefetches.push_back({a2, tier::host, 2});

  // c, d and a2 fill the host tier, so b's save lets redundant copies go. Loads crawl, copies
  // out do not: a2's copy out would start while its load is still on the link.
  tier_rig rig(4 * n, 3 * n, 10e6, 10e9);
  auto& dev = rig.dev;
  executor& ex = rig.ex;
  for (tensor_id id : {c, d, a2, b}) ex.define(id, t.tensors[id]);
  std::vector<unsigned char> cv(n, 1), dv(n, 2), av(n, 3);
  ex.upload(c, cv.data());
  ex.upload(d, dv.data());
  ex.upload(a2, av.data());
  auto bad_reads = std::make_shared<std::atomic<int>>(0);
  {  // unplanned: c and d come to the device and keep their tier copies; a2 stays on the host
    ex.begin_iteration();
    std::vector<tensor_id> cd = {c, d}, none;
    (void)ex.begin_op(0, cd, none, "fwd");
    ex.end_op(0);
    (void)ex.end_iteration();
  }
  // leave_device at the end put c and d back to their tier copies; run once more planned with
  // both on the device.
  ex.follow(&t, &p);
  for (int it = 0; it < 2; ++it) {
    ex.begin_iteration();
    std::vector<tensor_id> cd = {c, d}, bs = {b}, as = {a2}, none;
    (void)ex.begin_op(0, cd, bs, "fwd");
    dev.launch_kernel(ex.compute_stream(), [bp = ex.device_ptr(b)] { fill(bp, n / 4, 9); });
    ex.end_op(0);
    (void)ex.begin_op(1, bs, none, "mid");
    ex.end_op(1);
    ex.release(b);
    (void)ex.begin_op(2, as, none, "use");
    dev.launch_kernel(ex.compute_stream(), [ap = ex.device_ptr(a2), bad_reads] {
      if (!holds(ap, n, 3)) ++*bad_reads;
    });
    ex.end_op(2);
    (void)ex.end_iteration();
  }
  EXPECT_EQ(bad_reads->load(), 0) << "op 2 saw a2 saved before its load had landed";
  std::vector<unsigned char> got(n);
  ex.read(a2, got.data());
  EXPECT_TRUE(holds(got.data(), n, 3)) << "a2's value was lost";
}

// An op writes gradients without reading them (as a backward pass does); the plan copies both
// out right after it. When the second save finds the host tier full, the first gradient's copy
// is its only value, which the next op reads: only a copy that op's end made dead may go, and
// after op k has run that is judged after k, not k - 1.
TEST(Executor, AGradientSavedAfterTheOpThatWroteItIsNotTakenForDead) {
  constexpr std::uint64_t n = 1_MiB;
  trace t;
  const auto w = t.add_tensor("w", n, tensor_kind::parameter);
  const auto a = t.add_tensor("a", n, tensor_kind::activation);
  const auto g1 = t.add_tensor("g1", n, tensor_kind::gradient);
  const auto g2 = t.add_tensor("g2", n, tensor_kind::gradient);
  t.add_op("fwd", {w}, {a});
  t.add_op("bwd", {a, w}, {g1, g2});
  t.add_op("step", {g1, g2, w}, {w});
  t.validate();
  plan p = plan::empty_for(t, "gradients out after the backward", 4 * n);
  p.initial_tier = {tier::device, tier::device, tier::device, tier::device};
  p.steps[1].evictions.push_back({a, evict_action::drop});
  p.steps[1].evictions.push_back({g1, evict_action::evict_to_host});
  p.steps[1].evictions.push_back({g2, evict_action::evict_to_host});
  p.steps[2].prefetches.push_back({g1, tier::host, 2});
  p.steps[2].prefetches.push_back({g2, tier::host, 2});

  tier_rig rig(4 * n, 2 * n);  // w's copy and g1's: g2's save lets the redundant one go
  auto& dev = rig.dev;
  executor& ex = rig.ex;
  for (tensor_id id : {w, a, g1, g2}) ex.define(id, t.tensors[id]);
  std::vector<unsigned char> wv(n, 5);
  ex.upload(w, wv.data());
  ex.follow(&t, &p);
  auto bad_reads = std::make_shared<std::atomic<int>>(0);
  for (int it = 0; it < 2; ++it) {
    ex.begin_iteration();
    std::vector<tensor_id> ws = {w}, as = {a}, aw = {a, w}, gs = {g1, g2}, gsw = {g1, g2, w};
    (void)ex.begin_op(0, ws, as, "fwd");
    ex.end_op(0);
    (void)ex.begin_op(1, aw, gs, "bwd");
    dev.launch_kernel(ex.compute_stream(), [p1 = ex.device_ptr(g1), p2 = ex.device_ptr(g2)] {
      fill(p1, n, 11);
      fill(p2, n, 12);
    });
    ex.end_op(1);
    ex.release(a);
    ASSERT_NO_THROW((void)ex.begin_op(2, gsw, ws, "step")) << "iteration " << it << ": g1's only copy was let go";
    dev.launch_kernel(ex.compute_stream(), [p1 = ex.device_ptr(g1), p2 = ex.device_ptr(g2), bad_reads] {
      if (!holds(p1, n, 11) || !holds(p2, n, 12)) ++*bad_reads;
    });
    ex.end_op(2);
    (void)ex.end_iteration();
  }
  EXPECT_EQ(bad_reads->load(), 0);
}

// The executor's reruns (Note [Recomputation] in prefetch/plan.hpp) under hand-written plans: a
// value dropped without a copy is made again by its op's rerun before it is read, its memory is
// back in the meantime, and make_layout places the rerun's allocation where the executor makes it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"
#include "prefetch/layout.hpp"
#include "patterns.hpp"

using namespace spillway;
using namespace spillway::literals;
using spillway::test::holds;

namespace {

constexpr std::uint64_t n = 64_KiB;

struct rig {
  explicit rig(std::uint64_t budget) {
    device_options o;
    o.cpu_device_memory = 16_MiB;
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


// op0 "gen.forward" (recomputable) reads p, writes a; op1 "mid" reads p, writes b; op2 "use"
// reads a and b. The plan drops a after op0 and reruns op0 before op2.
struct fixture {
  trace t;
  tensor_id p = 0, a = 0, b = 0;
  plan pl;
  fixture() {
    p = t.add_tensor("p", n, tensor_kind::parameter);
    a = t.add_tensor("a", n, tensor_kind::activation);
    b = t.add_tensor("b", n, tensor_kind::activation);
    t.add_op("gen.forward", {p}, {a});
    t.add_op("mid", {p}, {b});
    t.add_op("use", {a, b}, {});
    t.ops[0].recomputable = true;
    t.validate();
    pl = plan::empty_for(t, "hand-made", 4 * n);
    pl.steps[0].evictions.push_back({a, evict_action::drop});
    pl.steps[2].recomputes.push_back(0);
    pl.validate(t);
  }
};

}  // namespace

TEST(ExecutorRecompute, ADroppedValueIsMadeAgainBeforeItsReadAndItsMemoryIsBackMeanwhile) {
  fixture f;
  rig r(4 * n);
  for (auto id : {f.p, f.a, f.b}) r.exec->define(id, f.t.tensors[id]);
  std::vector<unsigned char> init(n, 9);
  r.exec->upload(f.p, init.data());
  auto bad = std::make_shared<std::atomic<int>>(0);
  // op0's body: a = p + 1, checked and written on the compute stream.
  auto gen = [&] {
    void* pp = r.exec->device_ptr(f.p);
    void* pa = r.exec->device_ptr(f.a);
    r.dev->launch_kernel(r.exec->compute_stream(), [pp, pa, bad] {
      if (!holds(pp, n, 9)) ++*bad;
      std::memset(pa, 10, n);
    });
  };
  int reruns = 0;
  r.exec->set_rerun([&](op_index o) {
    EXPECT_EQ(o, 0u);
    ++reruns;
    gen();
  });
  r.exec->follow(&f.t, &f.pl);
  for (int it = 1; it <= 3; ++it) {
    r.exec->begin_iteration();
    const std::vector<tensor_id> p{f.p}, a{f.a}, b{f.b}, ab{f.a, f.b}, none;
    r.exec->begin_op(0, p, a, "gen.forward");
    gen();
    const std::uint64_t with_a = r.exec->device_bytes_in_use();
    r.exec->end_op(0);
    EXPECT_EQ(r.exec->device_bytes_in_use(), with_a - n) << "the drop of a gave its memory back";
    r.exec->begin_op(1, p, b, "mid");
    void* pb = r.exec->device_ptr(f.b);
    r.dev->launch_kernel(r.exec->compute_stream(), [pb] { std::memset(pb, 20, n); });
    r.exec->end_op(1);
    r.exec->begin_op(2, ab, none, "use");
    void* pa = r.exec->device_ptr(f.a);
    r.dev->launch_kernel(r.exec->compute_stream(), [pa, bad] {
      if (!holds(pa, n, 10)) ++*bad;
    });
    r.exec->end_op(2);
    r.exec->release(f.a);
    r.exec->release(f.b);
    const auto st = r.exec->end_iteration();
    EXPECT_EQ(st.recomputes, 1u) << "iteration " << it;
    EXPECT_EQ(st.on_demand_fetches, 0u) << "iteration " << it;
    EXPECT_EQ(st.d2h_bytes, 0u) << "a was dropped, not saved";
  }
  EXPECT_EQ(bad->load(), 0) << "an op or a rerun saw the wrong bytes";
  EXPECT_EQ(reruns, 3);
}

TEST(ExecutorRecompute, ARerunWithoutACallbackIsAUsageErrorNamingTheOps) {
  fixture f;
  rig r(4 * n);
  for (auto id : {f.p, f.a, f.b}) r.exec->define(id, f.t.tensors[id]);
  std::vector<unsigned char> init(n, 9);
  r.exec->upload(f.p, init.data());
  r.exec->follow(&f.t, &f.pl);
  r.exec->begin_iteration();
  const std::vector<tensor_id> p{f.p}, a{f.a}, b{f.b}, ab{f.a, f.b}, none;
  r.exec->begin_op(0, p, a, "gen.forward");
  r.exec->end_op(0);
  r.exec->begin_op(1, p, b, "mid");
  r.exec->end_op(1);
  try {
    r.exec->begin_op(2, ab, none, "use");
    ADD_FAILURE() << "no error";
  } catch (const usage_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("gen.forward"), std::string::npos) << m;
    EXPECT_NE(m.find("\"use\""), std::string::npos) << m;
    EXPECT_NE(m.find("set_rerun"), std::string::npos) << m;
  }
}

TEST(ExecutorRecompute, TheLayoutPlacesTheRerunsAllocationAndFreesTheDroppedValue) {
  fixture f;
  const auto l = make_layout(f.t, f.pl, {});
  EXPECT_TRUE(l.offset(f.a, layout_slot::place(0)).has_value());
  EXPECT_TRUE(l.offset(f.a, layout_slot::rerun(2)).has_value()) << "the rerun before op 2 allocates a again";
  // a is off the device between the drop and the rerun: p, b and a never need more than 3 blocks.
  EXPECT_LE(l.peak_live, 3 * n);
  std::size_t blocks_of_a = 0;
  for (const auto& b : l.placed) blocks_of_a += b.id == f.a ? 1 : 0;
  EXPECT_EQ(blocks_of_a, 2u);
}

// A chain spread over two steps (Note [Rerun temps across steps]): op0 makes a from p, op1
// makes b from a, and the program releases a after op1. The plan drops b after op1 and makes it
// again for op4: op0 is rerun before op3 (a, released, is a rerun temp) and op1 before op4,
// reading it. The executor keeps a from step 3 to step 4, then frees it; b holds op1's bits.
TEST(ExecutorRecompute, AReleasedValueARerunOfALaterStepReadsIsKeptUntilThen) {
  trace t;
  const auto p = t.add_tensor("p", n, tensor_kind::parameter);
  const auto a = t.add_tensor("a", n, tensor_kind::activation);
  const auto b = t.add_tensor("b", n, tensor_kind::activation);
  const auto c = t.add_tensor("c", n, tensor_kind::activation);
  const auto d = t.add_tensor("d", n, tensor_kind::activation);
  t.add_op("g0.forward", {p}, {a});
  t.add_op("g1.forward", {a}, {b});
  t.add_op("mid", {p}, {c});
  t.add_op("mid2", {p}, {d});
  t.add_op("use", {b, c, d}, {});
  t.ops[0].recomputable = true;
  t.ops[1].recomputable = true;
  t.validate();
  plan pl = plan::empty_for(t, "hand-made", 8 * n);
  pl.steps[1].evictions.push_back({b, evict_action::drop});
  pl.steps[3].recomputes.push_back(0);
  pl.steps[4].recomputes.push_back(1);
  pl.validate(t);

  rig r(8 * n);
  for (auto id : {p, a, b, c, d}) r.exec->define(id, t.tensors[id]);
  std::vector<unsigned char> init(n, 9);
  r.exec->upload(p, init.data());
  auto bad = std::make_shared<std::atomic<int>>(0);
  auto body = [&](op_index o) {
    if (o == 0) {
      void* pp = r.exec->device_ptr(p);
      void* pa = r.exec->device_ptr(a);
      r.dev->launch_kernel(r.exec->compute_stream(), [pp, pa, bad] {
        if (!holds(pp, n, 9)) ++*bad;
        std::memset(pa, 10, n);
      });
    } else {
      void* pa = r.exec->device_ptr(a);
      void* pb = r.exec->device_ptr(b);
      r.dev->launch_kernel(r.exec->compute_stream(), [pa, pb, bad] {
        if (!holds(pa, n, 10)) ++*bad;
        std::memset(pb, 11, n);
      });
    }
  };
  std::vector<op_index> reruns;
  r.exec->set_rerun([&](op_index o) {
    reruns.push_back(o);
    body(o);
  });
  r.exec->follow(&t, &pl);
  // Ops 0 to 3 of an iteration; the bytes in use after op 1.
  auto up_to_op3 = [&] {
    const std::vector<tensor_id> vp{p}, va{a}, vb{b}, vc{c}, vd{d};
    r.exec->begin_op(0, vp, va, "g0.forward");
    body(0);
    r.exec->end_op(0);
    r.exec->begin_op(1, va, vb, "g1.forward");
    body(1);
    r.exec->end_op(1);
    r.exec->release(a);
    const std::uint64_t after_op1 = r.exec->device_bytes_in_use();
    r.exec->begin_op(2, vp, vc, "mid");
    r.exec->end_op(2);
    r.exec->begin_op(3, vp, vd, "mid2");
    r.exec->end_op(3);
    return after_op1;
  };
  for (int it = 1; it <= 2; ++it) {
    reruns.clear();
    r.exec->begin_iteration();
    const std::vector<tensor_id> used{b, c, d}, none;
    const std::uint64_t after_op1 = up_to_op3();
    EXPECT_EQ(r.exec->device_bytes_in_use(), after_op1 + 3 * n) << "c, d, and a made before op 3 for op 4's rerun";
    r.exec->begin_op(4, used, none, "use");
    void* pb = r.exec->device_ptr(b);
    r.dev->launch_kernel(r.exec->compute_stream(), [pb, bad] {
      if (!holds(pb, n, 11)) ++*bad;
    });
    r.exec->end_op(4);
    EXPECT_EQ(r.exec->device_bytes_in_use(), after_op1 + 3 * n) << "a freed after op 4; b, c, d stay until release";
    for (auto id : {b, c, d}) r.exec->release(id);
    const auto st = r.exec->end_iteration();
    EXPECT_EQ(st.recomputes, 2u) << "iteration " << it;
    EXPECT_EQ(st.on_demand_fetches, 0u) << "iteration " << it;
    EXPECT_EQ(reruns, (std::vector<op_index>{0, 1})) << "iteration " << it;
  }
  EXPECT_EQ(bad->load(), 0) << "an op or a rerun saw the wrong bytes";

  // An iteration that ends before op 4 (the loop stopped early) gives back a, which op 3's
  // reruns made for op 4's: no value of it outlives the iteration.
  {
    r.exec->begin_iteration();
    (void)up_to_op3();
    for (auto id : {b, c, d}) r.exec->release(id);
    (void)r.exec->end_iteration();
    EXPECT_EQ(r.exec->device_bytes_in_use(), n) << "only p stays on the device; a rerun's a outlived the iteration";
    EXPECT_THROW(r.exec->check_readable(a), usage_error) << "a holds a value from the iteration before";
  }

  // make_layout keeps a placed from the rerun before op 3 through op 4's rerun, which is its
  // last reader; op 4 does not touch it, so it goes before op 4's own tensors (Note [Rerun
  // temps before the op]).
  const auto l = make_layout(t, pl, {});
  EXPECT_TRUE(l.offset(a, layout_slot::rerun(3)).has_value());
  EXPECT_FALSE(l.offset(a, layout_slot::rerun(4)).has_value()) << "no second allocation for op 4's rerun";
  bool kept = false;
  for (const auto& blk : l.placed)
    if (blk.id == a && blk.spans.size() == 1 && blk.spans[0].first == layout_slot::rerun(3))
      kept = blk.spans[0].second == layout_slot::place(4);
  EXPECT_TRUE(kept) << "a is placed from the rerun before op 3 until op 4's reruns have run";
}

// Note [Rerun temps before the op]: op0 makes a from p, op1 makes b from a (the program
// releases a after op1), op2 is idle, op3 reads b and writes g. The plan drops b after op1 and
// reruns op0 and op1 before op3. a, made only for op1's rerun, goes once the reruns have run,
// so g takes its bytes: the budget holds three tensors, never the four of p, a, b and g.
TEST(ExecutorRecompute, ARerunTempTheOpDoesNotTouchIsFreedBeforeTheOpsOwnTensors) {
  trace t;
  const auto p = t.add_tensor("p", n, tensor_kind::parameter);
  const auto a = t.add_tensor("a", n, tensor_kind::activation);
  const auto b = t.add_tensor("b", n, tensor_kind::activation);
  const auto c = t.add_tensor("c", n, tensor_kind::activation);
  const auto g = t.add_tensor("g", n, tensor_kind::activation);
  t.add_op("g0.forward", {p}, {a});
  t.add_op("g1.forward", {a}, {b});
  t.add_op("mid", {p}, {c});
  t.add_op("use", {b}, {g});
  t.ops[0].recomputable = true;
  t.ops[1].recomputable = true;
  t.validate();
  plan pl = plan::empty_for(t, "hand-made", 3 * n);
  pl.steps[1].evictions.push_back({b, evict_action::drop});
  pl.steps[3].recomputes = {0, 1};
  pl.validate(t);

  rig r(3 * n);
  for (auto id : {p, a, b, c, g}) r.exec->define(id, t.tensors[id]);
  std::vector<unsigned char> init(n, 9);
  r.exec->upload(p, init.data());
  auto bad = std::make_shared<std::atomic<int>>(0);
  auto body = [&](op_index o) {
    void* in = r.exec->device_ptr(o == 0 ? p : a);
    void* out = r.exec->device_ptr(o == 0 ? a : b);
    const unsigned char want = o == 0 ? 9 : 10, put = o == 0 ? 10 : 11;
    r.dev->launch_kernel(r.exec->compute_stream(), [in, out, want, put, bad] {
      if (!holds(in, n, want)) ++*bad;
      std::memset(out, put, n);
    });
  };
  r.exec->set_rerun(body);
  r.exec->follow(&t, &pl);
  for (int it = 1; it <= 2; ++it) {
    r.exec->begin_iteration();
    const std::vector<tensor_id> vp{p}, va{a}, vb{b}, vc{c}, vg{g};
    r.exec->begin_op(0, vp, va, "g0.forward");
    body(0);
    r.exec->end_op(0);
    r.exec->begin_op(1, va, vb, "g1.forward");
    body(1);
    r.exec->end_op(1);
    r.exec->release(a);
    r.exec->begin_op(2, vp, vc, "mid");
    r.exec->end_op(2);
    r.exec->release(c);
    r.exec->begin_op(3, vb, vg, "use");
    EXPECT_EQ(r.exec->device_bytes_in_use(), 3 * n) << "p, b and g: a went before g was placed";
    void* pb = r.exec->device_ptr(b);
    void* pg = r.exec->device_ptr(g);
    r.dev->launch_kernel(r.exec->compute_stream(), [pb, pg, bad] {
      if (!holds(pb, n, 11)) ++*bad;
      std::memset(pg, 12, n);
    });
    r.exec->end_op(3);
    for (auto id : {b, g}) r.exec->release(id);
    const auto st = r.exec->end_iteration();
    EXPECT_EQ(st.recomputes, 2u) << "iteration " << it;
    EXPECT_EQ(st.on_demand_evictions, 0u) << "iteration " << it;
    EXPECT_EQ(st.on_demand_fetches, 0u) << "iteration " << it;
  }
  EXPECT_EQ(bad->load(), 0) << "an op or a rerun saw the wrong bytes";

  // make_layout places a from the reruns before op 3 until op 3's own tensors, and g may take
  // its bytes: three blocks at most at any slot.
  const auto l = make_layout(t, pl, {});
  bool until_place = false;
  for (const auto& blk : l.placed)
    if (blk.id == a && blk.spans.size() == 1 && blk.spans[0].first == layout_slot::rerun(3))
      until_place = blk.spans[0].second == layout_slot::place(3);
  EXPECT_TRUE(until_place) << "a is placed from the reruns before op 3 until op 3's own tensors";
  EXPECT_LE(l.peak_live, 3 * n);
}

// A rerun whose tensors fit the budget by count but not in one piece: p and q, the rerun's
// inputs, sit apart with a free block of n beside each, and its output needs 2n. Everything else
// has left, so the executor takes everything off and places the rerun's tensors again into whole
// memory, as begin_op does for an op's own tensors, rather than failing for want of memory.
TEST(ExecutorRecompute, ARerunThatMeetsMemoryInPiecesPlacesItsTensorsAgainInWholeMemory) {
  trace t;
  const auto p = t.add_tensor("p", n, tensor_kind::parameter);
  const auto q = t.add_tensor("q", n, tensor_kind::parameter);
  const auto a = t.add_tensor("a", 2 * n, tensor_kind::activation);
  const auto b = t.add_tensor("b", n, tensor_kind::activation);
  t.add_op("gen.forward", {p, q}, {a});
  t.add_op("mid", {}, {b});
  t.add_op("use", {a, b, q}, {});
  t.ops[0].recomputable = true;
  t.validate();
  // After op 0: a dropped, q copied out (p stays at the bottom); op 1's b takes the block above
  // p; before op 2, q comes back above b, the rerun of op 0 needs p, q and 2n for a, and b, not
  // the rerun's, is evicted for it: free blocks of n at n and at 3n.
  plan pl = plan::empty_for(t, "hand-made", 4 * n);
  pl.steps[0].evictions.push_back({a, evict_action::drop});
  pl.steps[0].evictions.push_back({q, evict_action::evict_to_host});
  pl.steps[2].prefetches.push_back({q, tier::host, 2});
  pl.steps[2].recomputes.push_back(0);
  pl.validate(t);

  rig r(4 * n);
  for (auto id : {p, q, a, b}) r.exec->define(id, t.tensors[id]);
  std::vector<unsigned char> nine(n, 9), eight(n, 8);
  r.exec->upload(p, nine.data());
  r.exec->upload(q, eight.data());
  auto bad = std::make_shared<std::atomic<int>>(0);
  auto gen = [&] {
    void* pp = r.exec->device_ptr(p);
    void* pq = r.exec->device_ptr(q);
    void* pa = r.exec->device_ptr(a);
    r.dev->launch_kernel(r.exec->compute_stream(), [pp, pq, pa, bad] {
      if (!holds(pp, n, 9) || !holds(pq, n, 8)) ++*bad;
      std::memset(pa, 17, 2 * n);
    });
  };
  int reruns = 0;
  r.exec->set_rerun([&](op_index o) {
    EXPECT_EQ(o, 0u);
    ++reruns;
    gen();
  });
  r.exec->follow(&t, &pl);
  for (int it = 1; it <= 2; ++it) {
    r.exec->begin_iteration();
    const std::vector<tensor_id> pq{p, q}, av{a}, bv{b}, abq{a, b, q}, none;
    r.exec->begin_op(0, pq, av, "gen.forward");
    gen();
    r.exec->end_op(0);
    r.exec->begin_op(1, none, bv, "mid");
    void* pb = r.exec->device_ptr(b);
    r.dev->launch_kernel(r.exec->compute_stream(), [pb] { std::memset(pb, 20, n); });
    r.exec->end_op(1);
    ASSERT_NO_THROW(r.exec->begin_op(2, abq, none, "use")) << "iteration " << it;
    void* pa = r.exec->device_ptr(a);
    void* pb2 = r.exec->device_ptr(b);
    void* pq2 = r.exec->device_ptr(q);
    r.dev->launch_kernel(r.exec->compute_stream(), [pa, pb2, pq2, bad] {
      if (!holds(pa, 2 * n, 17) || !holds(pb2, n, 20) || !holds(pq2, n, 8)) ++*bad;
    });
    r.exec->end_op(2);
    r.exec->release(a);
    r.exec->release(b);
    const auto st = r.exec->end_iteration();
    EXPECT_EQ(st.recomputes, 1u) << "iteration " << it;
    EXPECT_LE(st.peak_device_bytes, 4 * n) << "iteration " << it;
  }
  EXPECT_EQ(bad->load(), 0) << "an op or a rerun saw the wrong bytes";
  EXPECT_EQ(reruns, 2);
}

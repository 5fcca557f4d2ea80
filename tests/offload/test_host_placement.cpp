// Ops on the host (Note [Host ops] in prefetch/plan.hpp): simulator timelines worked out by hand
// (1 s device ops, 1000 B/s links and host memory), the rules it enforces, the plan and executor
// refusing what they cannot run, the zero-offload planner's placements, auto against it on
// random training traces, and the profile and zoo knobs behind them. Suite HostOpsOnZoo: auto
// on whole zoo models, a minute or more each under the sanitizers; scripts/test runs them in its
// optimized phase only.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "unit_hw.hpp"

#include <algorithm>
#include <random>
#include <set>

#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/planner.hpp"
#include "offload/planner_host.hpp"
#include "offload/profile.hpp"
#include "offload/simulator.hpp"
#include "offload/trace_json.hpp"
#include "offload/zoo.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"
#include "../test_seed.hpp"

namespace spillway::offload {
namespace {

using namespace spillway::literals;

using testing::op1s;
using testing::unit_hw;

op_desc host_op(std::string name, std::vector<tensor_id> r, std::vector<tensor_id> w, std::uint64_t host_bytes) {
  op_desc o = op1s(std::move(name), std::move(r), std::move(w));
  o.phase = op_phase::optimizer;
  o.host_capable = true;
  o.host_bytes = host_bytes;
  return o;
}

// Two layers: f0 (W0 -> A0), f1 (A0, W1 -> A1), b1 (A1, A0, W1 -> G1), b0 (A0, W0 -> G0), then
// the steps in `order`, each reading its gradient and moment and writing its weight and moment.
struct two_layers {
  trace t;
  tensor_id w[2], g[2], m[2], a[2];
  op_index step[2];
};
two_layers make_two_layers(std::uint64_t host_bytes0, std::uint64_t host_bytes1, bool layer1_first) {
  two_layers s;
  auto& t = s.t;
  for (int l = 0; l < 2; ++l) {
    s.w[l] = t.add_tensor("W" + std::to_string(l), 1000, tensor_kind::parameter);
    s.g[l] = t.add_tensor("G" + std::to_string(l), 1000, tensor_kind::gradient);
    s.m[l] = t.add_tensor("M" + std::to_string(l), 1000, tensor_kind::optimizer_state);
    s.a[l] = t.add_tensor("A" + std::to_string(l), 1000, tensor_kind::activation);
  }
  t.add_op(op1s("f0", {s.w[0]}, {s.a[0]}));
  t.add_op(op1s("f1", {s.a[0], s.w[1]}, {s.a[1]}));
  t.add_op(op1s("b1", {s.a[1], s.a[0], s.w[1]}, {s.g[1]}));
  t.add_op(op1s("b0", {s.a[0], s.w[0]}, {s.g[0]}));
  const std::uint64_t hb[2] = {host_bytes0, host_bytes1};
  for (int i = 0; i < 2; ++i) {
    const int l = layer1_first ? 1 - i : i;
    s.step[l] = t.add_op(host_op("adam" + std::to_string(l), {s.g[l], s.m[l]}, {s.w[l], s.m[l]}, hb[l]));
  }
  t.validate();
  return s;
}

// The hand plan: steps on the host, weights up at op 0, gradients down after their last write.
plan hand_plan(const two_layers& s) {
  plan p = plan::empty_for(s.t, "hand", 1 << 20);
  for (int l = 0; l < 2; ++l) {
    p.steps[s.step[l]].on_host = true;
    p.initial_tier[s.w[l]] = p.initial_tier[s.g[l]] = p.initial_tier[s.m[l]] = tier::host;
    p.steps[0].prefetches.push_back({s.w[l], tier::host, static_cast<op_index>(l)});
  }
  p.steps[2].evictions = {{s.g[1], evict_action::evict_to_host}, {s.w[1], evict_action::drop}, {s.a[1], evict_action::drop}};
  p.steps[3].evictions = {{s.g[0], evict_action::evict_to_host}, {s.w[0], evict_action::drop}, {s.a[0], evict_action::drop}};
  return p;
}

// Every placeable step on the host, the device part planned by auto on the device view.
sim_result all_steps_on_host(const trace& t, const lifetime_report& r, const hw_profile& hw,
                                             std::uint64_t budget) {
  const auto p = detail::make_all_on_host_planner(make_planner("auto"))->make_plan(t, r, hw, budget);
  return simulate(t, r, p, hw);
}

double track_start(const sim_result& r, sim_track tr, std::uint32_t id) {
  for (const auto& e : r.timeline)
    if (e.track == tr && e.id == id) return e.start;
  return -1;
}

TEST(HostOps, HandTimelineOverlapsTheBackwardPass) {
  // Steps in the order their gradients land (layer 1 first), 2 s each on the host.
  const auto s = make_two_layers(2000, 2000, true);
  sim_options o;
  o.record_timeline = true;
  const auto r = simulate(s.t, hand_plan(s), unit_hw(), o);
  ASSERT_TRUE(r.feasible()) << r.violations.front();
  // H2D W0 [0,1], W1 [1,2]; f0 [1,2]; f1 [2,3]; b1 [3,4]; D2H G1 [4,5] beside b0 [4,5]; D2H G0
  // [5,6]. adam1 waits for G1: [5,7], during b0's copy; adam0 waits for G0 and the host: [7,9].
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::host, s.step[1]), 5.0);
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::host, s.step[0]), 7.0);
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::compute, 3), 4.0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 9.0);
  EXPECT_DOUBLE_EQ(r.compute_seconds, 4.0);
  EXPECT_DOUBLE_EQ(r.host_seconds, 4.0);
  EXPECT_EQ(r.host_ops, 2u);
  // Only the 16-bit copies cross the link: weights up, gradients down; the moments never do.
  EXPECT_EQ(r.h2d_bytes, 2000u);
  EXPECT_EQ(r.d2h_bytes, 2000u);
  for (const auto& e : r.timeline)
    if (e.track == sim_track::h2d || e.track == sim_track::d2h) {
      EXPECT_TRUE(e.id != s.m[0] && e.id != s.m[1]);
    }
}

TEST(HostOps, HostOpsRunInProgramOrder) {
  // Steps in forward order, as the executor runs them (one after another on the thread that
  // issues the iteration): adam0 (2 s) waits for G0 until 6: [6,8]; adam1 (1 s), ready at 5,
  // waits for it: [8,9]. (A host that ran whichever step is ready would end at 8.)
  const auto s = make_two_layers(2000, 1000, false);
  sim_options o;
  o.record_timeline = true;
  const auto r = simulate(s.t, hand_plan(s), unit_hw(), o);
  ASSERT_TRUE(r.feasible()) << r.violations.front();
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::host, s.step[0]), 6.0);
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::host, s.step[1]), 8.0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 9.0);
}

TEST(HostOps, DeviceWorkAfterAHostOpIsIssuedWhenItEnds) {
  // f [0,1] on the device; the host step (3 s) beside it [0,3]; g reads only f's output, yet the
  // executor enqueues it once the host step is done: [3,4].
  trace t;
  const auto g = t.add_tensor("G", 1000, tensor_kind::gradient);
  const auto m = t.add_tensor("M", 1000, tensor_kind::optimizer_state);
  const auto x = t.add_tensor("X", 1000, tensor_kind::activation);
  const auto y = t.add_tensor("Y", 1000, tensor_kind::activation);
  t.add_op(op1s("f", {}, {x}));
  const auto h = t.add_op(host_op("adam", {g, m}, {m}, 3000));
  const auto after = t.add_op(op1s("g", {x}, {y}));
  t.validate();
  plan p = plan::empty_for(t, "hand", 1 << 20);
  p.steps[h].on_host = true;
  p.initial_tier[g] = p.initial_tier[m] = tier::host;
  p.steps[after].evictions = {{x, evict_action::drop}, {y, evict_action::drop}};
  sim_options o;
  o.record_timeline = true;
  const auto r = simulate(t, p, unit_hw(), o);
  ASSERT_TRUE(r.feasible()) << r.violations.front();
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::host, h), 0.0);
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::compute, after), 3.0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 4.0);
}

TEST(HostOps, TheNextReadWaitsForTheHostOpAndItsCopyUp) {
  // W written on the host, then read on the device: its prefetch waits for the host op's end.
  trace t;
  const auto w = t.add_tensor("W", 1000, tensor_kind::parameter);
  const auto m = t.add_tensor("M", 3000, tensor_kind::optimizer_state);
  t.add_op(host_op("step", {m}, {w, m}, 3000));  // 3 s on the host
  t.add_op(op1s("idle", {}, {}));
  t.add_op(op1s("use", {w}, {}));
  plan p = plan::empty_for(t, "hand", 1 << 20);
  p.initial_tier[w] = p.initial_tier[m] = tier::host;
  p.steps[0].on_host = true;
  p.steps[1].prefetches.push_back({w, tier::host, 2});
  p.steps[2].evictions.push_back({w, evict_action::drop});
  sim_options o;
  o.record_timeline = true;
  const auto r = simulate(t, p, unit_hw(), o);
  ASSERT_TRUE(r.feasible()) << r.violations.front();
  // step [0,3] on the host; idle [0,1] on the device; H2D W [3,4]; use [4,5].
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::h2d, w), 3.0);
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::compute, 2), 4.0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 5.0);
}

TEST(HostOps, SynchronousStepsWaitForEverythingBefore) {
  // The hand plan with both steps synchronous: f0 waits for both weights' copies up: [2,3], so
  // the device work moves by 1 s (b0 [5,6], G0 down [6,7]); adam1 waits for every copy: [7,9];
  // adam0 waits for adam1: [9,11].
  const auto s = make_two_layers(2000, 2000, true);
  plan p = hand_plan(s);
  p.steps[0].synchronous = p.steps[s.step[0]].synchronous = p.steps[s.step[1]].synchronous = true;
  sim_options o;
  o.record_timeline = true;
  const auto r = simulate(s.t, p, unit_hw(), o);
  ASSERT_TRUE(r.feasible()) << r.violations.front();
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::compute, 0), 2.0);
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::host, s.step[1]), 7.0);
  EXPECT_DOUBLE_EQ(track_start(r, sim_track::host, s.step[0]), 9.0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 11.0);
}

TEST(HostOps, RulesTheSimulatorEnforces) {
  const auto s = make_two_layers(1000, 1000, true);
  {  // The gradient never copied down: the host op has nothing to read.
    plan p = hand_plan(s);
    p.steps[3].evictions[0].action = evict_action::drop;
    const auto r = simulate(s.t, p, unit_hw());
    EXPECT_FALSE(r.feasible());
    bool missing = false;
    for (const auto& v : r.violations) missing |= v.find("('adam0') on the host reads 'G0', which has no valid copy") != std::string::npos;
    EXPECT_TRUE(missing) << ::testing::PrintToString(r.violations);
  }
  {  // A weight left on the device while the host rewrites it ends the step stale.
    plan p = hand_plan(s);
    p.initial_tier[s.w[0]] = tier::device;
    p.steps[0].prefetches.erase(p.steps[0].prefetches.begin());
    p.steps[3].evictions.erase(p.steps[3].evictions.begin() + 1);
    const auto r = simulate(s.t, p, unit_hw());
    EXPECT_FALSE(r.feasible());
    bool stale = false;
    for (const auto& v : r.violations) stale |= v.find("stale") != std::string::npos;
    EXPECT_TRUE(stale);
  }
  {  // A profile without host rates cannot time a host op: infinite, never chosen.
    auto hw = unit_hw();
    hw.host_mem_bytes_per_s = 0;
    hw.host_cores = hw.host_vector_width = 0;
    hw.host_clock_hz = 0;
    EXPECT_FALSE(hw.runs_host_ops());
    EXPECT_TRUE(std::isinf(hw.host_op_seconds(s.t.ops[s.step[0]])));
  }
}

TEST(HostOps, APlanRefusesWhatCannotRunOnTheHostAndTheExecutorTakesTheRest) {
  const auto s = make_two_layers(1000, 1000, true);
  plan p = hand_plan(s);
  p.steps[0].on_host = true;  // f0 is not host_capable
  try {
    p.validate(s.t);
    FAIL() << "a device-only op placed on the host was accepted";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("'f0'"), std::string::npos) << e.what();
  }
  // The executor follows host placements and synchronous steps (Note [Host ops in the executor]).
  device_options o;
  o.cpu_device_memory = 4_MiB;
  cpu_device dev(o);
  executor_stack_options so;
  so.device_budget = 1_MiB;
  executor_stack stack(dev, so);
  const plan good = hand_plan(s);
  EXPECT_NO_THROW(stack.exec().follow(&s.t, &good));
  plan synchronous = plan::empty_for(s.t, "sync", 1_MiB);
  synchronous.steps[1].synchronous = true;
  EXPECT_NO_THROW(stack.exec().follow(&s.t, &synchronous));
  const plan device_only = plan::empty_for(s.t, "none", 1_MiB);
  EXPECT_NO_THROW(stack.exec().follow(&s.t, &device_only));
}

hw_profile small_v100() {
  auto hw = get_profile("v100-32g");
  return hw;
}

TEST(HostOps, ZeroOffloadPlacesEveryStepOnTheHost) {
  zoo_options zo;
  zo.layers = 2;
  zo.batch = 2;
  zo.seq = 128;
  const auto t = make_model_trace("gpt2-small", zo);
  const auto r = analyze(t);
  const auto hw = small_v100();
  const auto budget = std::max(r.min_budget_bytes, r.peak_live_bytes / 3);
  const auto p = make_planner("zero-offload")->make_plan(t, r, hw, budget);
  const auto s = simulate(t, r, p, hw);
  ASSERT_TRUE(s.feasible()) << s.violations.front();
  std::size_t steps = 0;
  for (op_index k = 0; k < t.ops.size(); ++k) {
    EXPECT_EQ(p.steps[k].on_host, t.ops[k].host_capable) << t.ops[k].name;
    steps += t.ops[k].host_capable;
  }
  EXPECT_EQ(s.host_ops, steps);
  EXPECT_GT(s.recomputes, 0u);  // activations checkpointed per layer
  std::uint64_t params = 0;
  for (tensor_id x = 0; x < t.tensors.size(); ++x) {
    const auto kind = t.tensors[x].kind;
    if (kind == tensor_kind::parameter) params += t.tensors[x].bytes;
    if (kind == tensor_kind::optimizer_state || kind == tensor_kind::parameter) {
      EXPECT_EQ(p.initial_tier[x], tier::host);
    }
  }
  // Master weights and moments never move; every 16-bit parameter comes up at op 0, once.
  for (const auto& st : p.steps) {
    for (const auto& e : st.evictions) EXPECT_NE(t.tensors[e.tensor].kind, tensor_kind::optimizer_state);
    for (const auto& f : st.prefetches) EXPECT_NE(t.tensors[f.tensor].kind, tensor_kind::optimizer_state);
  }
  std::uint64_t up_front = 0;
  for (const auto& f : p.steps[0].prefetches)
    if (t.tensors[f.tensor].kind == tensor_kind::parameter) up_front += t.tensors[f.tensor].bytes;
  EXPECT_EQ(up_front, params);
  EXPECT_LT(s.d2h_bytes, 2 * params);  // gradients down (plus activations at most), no fp32 state
}

// A random training step whose updates are host_capable: layers of forward ops, backward ops in
// reverse, one step per layer reading its gradient and moments and writing its weight.
trace random_host_training(std::mt19937_64& rng) {
  trace t;
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  auto secs = [&] { return 0.2 * static_cast<double>(1 + pick(5)); };
  auto op = [&](std::string name, std::vector<tensor_id> r, std::vector<tensor_id> w, bool fwd) {
    op_desc o;
    o.name = std::move(name);
    o.reads = std::move(r);
    o.writes = std::move(w);
    o.measured_seconds = secs();
    o.recomputable = fwd;
    return o;
  };
  std::vector<tensor_id> acts{t.add_tensor("input", 1000, tensor_kind::activation)};
  t.add_op(op("load", {}, {acts[0]}, false));
  struct layer {
    tensor_id w, g, m;
    std::vector<op_index> fwd;
  };
  std::vector<layer> layers;
  for (std::size_t l = 2 + pick(3); l > 0; --l) {
    layer ly;
    const std::uint64_t b = 1000 * (1 + pick(4));
    const std::string n = std::to_string(layers.size());
    ly.w = t.add_tensor("w" + n, b, tensor_kind::parameter);
    ly.g = t.add_tensor("g" + n, b, tensor_kind::gradient);
    ly.m = t.add_tensor("m" + n, 6 * b, tensor_kind::optimizer_state);
    for (std::size_t k = 1 + pick(2); k > 0; --k) {
      const auto out = t.add_tensor("a" + std::to_string(t.tensors.size()), 1000 * (1 + pick(3)), tensor_kind::activation);
      ly.fwd.push_back(t.add_op(op("f" + std::to_string(t.ops.size()), {acts.back(), ly.w}, {out}, true)));
      acts.push_back(out);
    }
    layers.push_back(ly);
  }
  auto grad = t.add_tensor("dloss", 1000, tensor_kind::activation);
  t.add_op(op("loss", {acts.back()}, {grad}, false));
  for (auto l = layers.rbegin(); l != layers.rend(); ++l)
    for (auto f = l->fwd.rbegin(); f != l->fwd.rend(); ++f) {
      std::set<tensor_id> r(t.ops[*f].reads.begin(), t.ops[*f].reads.end());
      r.insert(grad);
      if (f != l->fwd.rbegin()) r.insert(l->g);
      const auto next = t.add_tensor("d" + std::to_string(t.tensors.size()), 1000, tensor_kind::activation);
      t.add_op(op("b" + std::to_string(t.ops.size()), {r.begin(), r.end()}, {next, l->g}, false));
      grad = next;
    }
  for (const auto& l : layers) {
    op_desc o = op("adam", {l.g, l.m}, {l.w, l.m}, false);
    o.phase = op_phase::optimizer;
    o.host_capable = true;
    o.host_bytes = t.tensors[l.g].bytes + 2 * t.tensors[l.m].bytes + t.tensors[l.w].bytes;
    t.add_op(std::move(o));
  }
  t.validate();
  return t;
}

TEST(HostOps, AutoIsNeverSlowerThanZeroOffload) {
  std::mt19937_64 rng(spillway::test::test_seed(18));
  int hosted = 0;
  for (int iter = 0; iter < 40; ++iter) {
    const auto t = random_host_training(rng);
    const auto r = analyze(t);
    auto hw = unit_hw();
    hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 2000.0 * static_cast<double>(1 + rng() % 20);
    hw.host_mem_bytes_per_s = 1000.0 * static_cast<double>(1 + rng() % 100);
    const std::uint64_t lo = r.min_budget_bytes, hi = std::max(r.peak_live_bytes, lo);
    const auto budget = std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
    const auto z = simulate(t, r, make_planner("zero-offload")->make_plan(t, r, hw, budget), hw);
    const auto pa = make_planner("auto")->make_plan(t, r, hw, budget);
    const auto a = simulate(t, r, pa, hw);
    ASSERT_TRUE(a.feasible()) << "iteration " << iter << ": " << a.violations.front();
    if (z.feasible()) {
      EXPECT_LE(a.step_seconds, z.step_seconds * (1 + 1e-9)) << "iteration " << iter;
    }
    hosted += pa.host_op_count() > 0;
  }
  EXPECT_GT(hosted, 5);  // auto does choose the host, not only the device plan
}

TEST(HostOps, TheTailGoesBackToTheDevice) {
  // The device's last op ends at 4; host op 2 ends at 3 (kept there), host op 3 at 5 (it holds
  // the step up: back to the device). An op the set does not place stays off.
  sim_result sim;
  sim.timeline = {{sim_track::compute, 0, 0, 1, 0}, {sim_track::recompute, 1, 1, 4, 0},
                  {sim_track::host, 2, 1, 3, 0},    {sim_track::host, 3, 3, 5, 0}};
  sim.step_seconds = 5;
  trace t;
  for (int i = 0; i < 5; ++i) t.add_op(op1s("op" + std::to_string(i), {}, {}));
  EXPECT_EQ(detail::tail_on_device(t, {0, 0, 1, 1, 0}, sim), std::vector<char>({0, 0, 1, 0, 0}));
  // A tail of 1 s, no longer than the least asked for: the set as it was.
  EXPECT_EQ(detail::tail_on_device(t, {0, 0, 1, 1, 0}, sim, 1.0), std::vector<char>({0, 0, 1, 1, 0}));
  EXPECT_EQ(detail::tail_on_device(t, {0, 0, 1, 1, 0}, sim, 0.99), std::vector<char>({0, 0, 1, 0, 0}));
  // Nothing on the host past the device: the set as it was.
  sim.timeline.pop_back();
  sim.step_seconds = 4;
  EXPECT_EQ(detail::tail_on_device(t, {0, 0, 1, 1, 0}, sim), std::vector<char>({0, 0, 1, 1, 0}));
}

TEST(HostOpsOnZoo, AutoRunsTheLastGradientsStepsOnTheDevice) {
  // GPT-2 medium at 1/4 of its peak on h200: with every step on the host, the embedding's step
  // (its gradient is done last) runs after the device has finished. auto keeps the other steps
  // on the host, runs that one on the device, and is faster than every step on the host.
  const auto t = make_model_trace("gpt2-medium");
  const auto r = analyze(t);
  const auto hw = get_profile("h200");
  const auto budget = r.peak_live_bytes / 4;
  const auto all = all_steps_on_host(t, r, hw, budget);
  const auto pa = make_planner("auto")->make_plan(t, r, hw, budget);
  const auto a = simulate(t, r, pa, hw);
  ASSERT_TRUE(a.feasible()) << a.violations.front();
  EXPECT_GT(pa.host_op_count(), 0u);
  op_index wte = 0;
  for (op_index k = 0; k < t.ops.size(); ++k)
    if (t.ops[k].name == "adam.wte") wte = k;
  ASSERT_GT(wte, 0u);
  EXPECT_FALSE(pa.steps[wte].on_host);
  EXPECT_LT(a.step_seconds, all.step_seconds);
}

TEST(HostOps, LastStepsOnDeviceCountTheWeightsTheySendUp) {
  // Steps in order adam0 (op 4), adam1 (op 5): the last goes first. Each writes a 1000-byte
  // weight the device reads and a moment only it touches, so 1000 weight bytes take one step,
  // 1001 both; none asked for, the set as it was.
  const auto s = make_two_layers(4000, 4000, false);
  const auto r = analyze(s.t);
  const std::vector<char> all = {0, 0, 0, 0, 1, 1};
  EXPECT_EQ(detail::last_steps_on_device(s.t, r, all, 0), all);
  EXPECT_EQ(detail::last_steps_on_device(s.t, r, all, 1000), std::vector<char>({0, 0, 0, 0, 1, 0}));
  EXPECT_EQ(detail::last_steps_on_device(s.t, r, all, 1001), std::vector<char>({0, 0, 0, 0, 0, 0}));
}

TEST(HostOps, AutoKeepsTheFirstLayersStepsOnTheDeviceWhenTheForwardWaitsForTheirWeights) {
  // GPT-3 6.7B cut to 4 blocks, at 1/2 of its peak on h200: with every step on the host, the
  // 16-bit weights all come back up during the forward pass, more than its compute hides.
  // Running the steps that would outlast the device's work on the device (the embedding's and
  // most of the first block's) still leaves a 2.4 ms wait; auto keeps the first block's MLP
  // output weight's step there too, its weight on the device across the iteration, and the
  // forward pass no longer waits. The last block's steps stay on the host.
  zoo_options o;
  o.layers = 4;
  const auto t = make_model_trace("gpt3-6.7b", o);
  const auto r = analyze(t);
  const auto hw = get_profile("h200");
  const auto budget = r.peak_live_bytes / 2;
  const auto all = all_steps_on_host(t, r, hw, budget);
  ASSERT_TRUE(all.feasible()) << all.violations.front();
  EXPECT_GT(all.stall_seconds, 0.02 * all.step_seconds);
  const auto pa = make_planner("auto")->make_plan(t, r, hw, budget);
  const auto a = simulate(t, r, pa, hw);
  ASSERT_TRUE(a.feasible()) << a.violations.front();
  auto step_of = [&](const std::string& name) {
    for (op_index k = 0; k < t.ops.size(); ++k)
      if (t.ops[k].name == name) return k;
    ADD_FAILURE() << name;
    return op_index{0};
  };
  EXPECT_FALSE(pa.steps[step_of("adam.h0.mlp.fc2.w")].on_host);
  EXPECT_TRUE(pa.steps[step_of("adam.h3.mlp.fc1.w")].on_host);
  EXPECT_LT(a.step_seconds, all.step_seconds);
  EXPECT_LT(a.stall_seconds, 0.01 * a.step_seconds);
}

TEST(HostOpsOnZoo, TheWeightsComeUpInTheOrderOfTheirUse) {
  // ResNet-152 at 1/8 of its peak on h200, every step on the host: every weight comes up at the
  // first op, in the order the forward pass reads them, so the stem's convolution waits for its
  // own weight only, not for the last layer's.
  const auto t = make_model_trace("resnet152");
  const auto r = analyze(t);
  const auto hw = get_profile("h200");
  const auto budget = r.peak_live_bytes / 8;
  const auto p = detail::make_all_on_host_planner(make_planner("auto"))->make_plan(t, r, hw, budget);
  const auto& first = p.steps[0].prefetches;
  ASSERT_GT(first.size(), 100u);
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end(), [](const prefetch& a, const prefetch& b) { return a.use < b.use; }));
  sim_options o;
  o.record_timeline = true;
  const auto s = simulate(t, r, p, hw, o);
  ASSERT_TRUE(s.feasible()) << s.violations.front();
  // The first convolution starts within a few of its weights' copies of the iteration's start.
  op_index conv = 0;
  while (t.ops[conv].name != "stem.conv") ++conv;
  EXPECT_LT(track_start(s, sim_track::compute, conv), 0.2e-3);
}

TEST(HostOps, PlaceableOpsKeepDeviceUsesBeforeHostUses) {
  // A step whose weight a later device op reads in the same iteration stays on the device.
  trace t;
  const auto w = t.add_tensor("W", 1000, tensor_kind::parameter);
  const auto m = t.add_tensor("M", 1000, tensor_kind::optimizer_state);
  t.add_op(op1s("use", {w}, {}));
  t.add_op(host_op("step", {m}, {w, m}, 1000));
  t.add_op(op1s("use_again", {w}, {}));
  const auto r = analyze(t);
  EXPECT_EQ(detail::all_host_ops(t, r, unit_hw()), std::vector<char>({0, 0, 0}));
  t.ops.pop_back();
  const auto r2 = analyze(t);
  EXPECT_EQ(detail::all_host_ops(t, r2, unit_hw()), std::vector<char>({0, 1}));
}

TEST(HostOps, AWeightARerunReadsStaysUntilTheRerun) {
  // f reads W and writes A (recomputable); the backward op reads A but not W; the step runs on
  // the host. The view's plan drops A after f and reruns f before b, so W's last device use is
  // that rerun, not f: the plan for the trace keeps W on the device until then.
  trace t;
  const auto w = t.add_tensor("W", 1000, tensor_kind::parameter);
  const auto g = t.add_tensor("G", 1000, tensor_kind::gradient);
  const auto m = t.add_tensor("M", 1000, tensor_kind::optimizer_state);
  const auto a = t.add_tensor("A", 1000, tensor_kind::activation);
  const auto s = t.add_tensor("S", 1000, tensor_kind::workspace);
  op_desc f = op1s("f", {w}, {a});
  f.recomputable = true;
  t.add_op(f);
  t.add_op(op1s("scratch", {}, {s}));
  t.add_op(op1s("b", {a}, {g}));
  t.add_op(host_op("step", {w, g, m}, {w, m}, 3000));
  t.validate();
  const auto r = analyze(t);
  const auto hw = unit_hw();
  const std::vector<char> on_host = {0, 0, 0, 1};
  ASSERT_EQ(detail::all_host_ops(t, r, hw), on_host);
  const auto v = detail::make_device_view(t, on_host);
  plan pv = plan::empty_for(v.t, "hand", 3000);
  pv.initial_tier[g] = pv.initial_tier[m] = tier::host;  // M only the step touches; G written by b
  pv.steps[0].evictions.push_back({a, evict_action::drop});
  pv.steps[1].evictions.push_back({s, evict_action::drop});
  pv.steps[2].recomputes.push_back(0);
  pv.steps[2].evictions.push_back({a, evict_action::drop});
  pv.steps[2].evictions.push_back({g, evict_action::evict_to_host});
  const auto vs = simulate(v.t, v.r, pv, hw);
  ASSERT_TRUE(vs.feasible()) << vs.violations.front();
  const auto p = detail::plan_from_view(t, r, v, pv, "hand");
  const auto sim = simulate(t, r, p, hw);
  ASSERT_TRUE(sim.feasible()) << sim.violations.front();
  EXPECT_EQ(sim.recomputes, 1u);
  EXPECT_EQ(sim.host_ops, 1u);
  // W leaves the device after b (the rerun's op), not after f.
  auto leaves_at = [&](tensor_id x) {
    for (op_index k = 0; k < t.ops.size(); ++k)
      for (const auto& e : p.steps[k].evictions)
        if (e.tensor == x) return static_cast<std::int64_t>(k);
    return std::int64_t{-1};
  };
  EXPECT_EQ(leaves_at(w), 2);
}

TEST(HostOps, TraceJsonKeepsHostFields) {
  const auto s = make_two_layers(2000, 1000, false);
  const auto back = trace_from_json(trace_to_json(s.t));
  EXPECT_TRUE(back.ops[s.step[0]].host_capable);
  EXPECT_EQ(back.ops[s.step[0]].host_bytes, 2000u);
  EXPECT_FALSE(back.ops[0].host_capable);
  auto j = trace_to_json(s.t);
  j["ops"][0]["host_bytes"] = 10;  // a host cost on an op that may not run there
  try {
    (void)trace_from_json(j);
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("host_capable"), std::string::npos) << e.what();
  }
}

TEST(HostOps, ProfileHostFields) {
  const auto v = get_profile("v100-32g");
  EXPECT_EQ(v.device_bytes, 32'000'000'000u);
  EXPECT_DOUBLE_EQ(v.compute_flops_per_s, 125e12 * 0.5);
  EXPECT_TRUE(v.runs_host_ops());
  EXPECT_EQ(v.host_cores, 48);
  op_desc adam;
  adam.host_bytes = 28'000'000'000;  // a 1B-parameter step in mixed precision
  adam.host_flops = 12e9;
  EXPECT_NEAR(v.host_op_seconds(adam), 28e9 / v.host_mem_bytes_per_s, 1e-12);  // bandwidth-bound
  adam.host_bytes = 1;
  EXPECT_NEAR(v.host_op_seconds(adam), 12e9 / (48.0 * 64 * 2.7e9), 1e-12);  // then flops-bound
  // JSON: round trip; all four host fields or none; bad values named.
  const auto j = profile_to_json(v);
  EXPECT_DOUBLE_EQ(profile_from_json(j).host_mem_bytes_per_s, v.host_mem_bytes_per_s);
  auto partial = j;
  partial.erase("host_cores");
  EXPECT_THROW((void)profile_from_json(partial), config_error);
  auto bad = j;
  bad["host_cores"] = 2.5;
  try {
    (void)profile_from_json(bad);
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("host_cores"), std::string::npos);
  }
  bad = j;
  bad["host_memory_gbps"] = -1;
  EXPECT_THROW((void)profile_from_json(bad), config_error);
  auto none = j;
  for (const char* f : {"host_memory_gbps", "host_cores", "host_vector_width", "host_ghz"}) none.erase(f);
  EXPECT_FALSE(profile_from_json(none).runs_host_ops());
}

double params_of(const trace& t, double bytes_per) {
  double sum = 0;
  for (const auto& x : t.tensors)
    if (x.kind == tensor_kind::parameter) sum += static_cast<double>(x.bytes) / bytes_per;
  return sum;
}

TEST(HostOps, ZooShapePrecisionAndClipping) {
  zoo_options o;
  o.batch = 1;
  o.seq = 1024;
  o.layers = 50;
  o.hidden = 4096;
  o.heads = 32;
  const auto t = make_model_trace("gpt3-13b", o);
  EXPECT_NEAR(params_of(t, 2) / 1e9, 10.28, 0.05);  // the ZeRO-Offload paper's 10B shape
  EXPECT_EQ(zoo_size("gpt3-13b", o, t).tokens, 1024u);
  // Every Adam step may run on the host, moving 28 bytes per parameter there.
  for (const auto& op : t.ops)
    if (op.phase == op_phase::optimizer) {
      ASSERT_TRUE(op.host_capable);
      EXPECT_EQ(op.host_bytes % 28, 0u);
      EXPECT_DOUBLE_EQ(op.host_flops, 12.0 * static_cast<double>(op.host_bytes / 28));
    }
  o.layers = 2;
  o.hidden = 256;
  o.heads = 4;
  o.seq = 64;
  zoo_options f = o;
  f.precision = zoo_precision::fp32;
  EXPECT_DOUBLE_EQ(params_of(make_model_trace("gpt2-small", f), 4), params_of(make_model_trace("gpt2-small", o), 2));
  zoo_options c = o;
  c.clip_grad_norm = true;
  const auto tc = make_model_trace("gpt2-small", c);
  const auto norm = tc.find_tensor("grad_norm");
  ASSERT_TRUE(norm.has_value());
  for (const auto& op : tc.ops)
    if (op.category == "optimizer" && op.name != "clip.grad_norm") {
      EXPECT_NE(std::find(op.reads.begin(), op.reads.end(), *norm), op.reads.end());
    }
  EXPECT_EQ(tc.ops.size(), make_model_trace("gpt2-small", o).ops.size() + 1);
  // Bad knobs are refused with the reason.
  zoo_options h = o;
  h.heads = 3;
  try {
    (void)make_model_trace("gpt2-small", h);
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("do not divide"), std::string::npos);
  }
  zoo_options cnn;
  cnn.hidden = 512;
  EXPECT_THROW((void)make_model_trace("resnet50", cnn), config_error);
  EXPECT_THROW((void)parse_zoo_precision("fp8", "--precision"), config_error);
  EXPECT_EQ(parse_zoo_precision("fp16", "--precision"), zoo_precision::fp16);
}

}  // namespace
}  // namespace spillway::offload

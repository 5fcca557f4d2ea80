// The executor and its tier backing when a device call fails: for every copy, event record, event creation and
// stream wait an iteration makes, an iteration in which that one call fails. The iteration may
// fail (with the device's error), but afterwards no parameter has lost its value, and the next
// iteration, with the device answering again, computes the right result. An iteration that did
// not report an error computed the right result too. One parameter is updated in the iteration:
// after a failure it holds its value from before the iteration or from after the update.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../device/faulty_device.hpp"
#include "../session/watchdog.hpp"
#include "../swap/swap_test_support.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"
#include "prefetch/tier_backing.hpp"
#include "swap/host_tier.hpp"

using namespace spillway;
using namespace spillway::literals;
using test::device_call;
using test::fault_rule;
using test::faulty_device;

namespace {

constexpr std::uint64_t n = 64_KiB;

// Where the parameters live, and whether the plan recomputes a instead of swapping it.
struct variant {
  tier where = tier::host;
  bool recompute = false;
};

// Parameters x, y and w in the tier `where` (host or NVMe); op0: a = x ^ 0x5a, op1: b = y + 1,
// op2: c = a + b, op3: w += c. The plan prefetches x and y at op 0 and drops them after their
// ops, swaps a out to the tier after op 0 and prefetches it back at op 1 for op 2, prefetches w
// at op 2 and swaps it out after op 3: copies both ways, each with its events and waits (through
// a staging block and the NVMe tier's I/O threads for NVMe). With `recompute`, a is dropped after
// op 0 and op 0 runs again before op 2, x prefetched back for it.
struct rig {
  explicit rig(variant v) {
    const tier where = v.where;
    device_options o;  // the strict cpu backend: every rule on
    o.cpu_device_memory = 16_MiB;
    dev = std::make_unique<faulty_device>(std::make_unique<cpu_device>(o));
    executor_stack_options so;
    so.device_budget = (v.recompute ? 5 : 4) * n;
    if (where == tier::nvme) {
      so.host_budget = 4_KiB;  // holds none of them
      nvme_options no;
      no.directories = {dir.path()};
      no.reserve = 8_MiB;
      so.nvme = no;
    }
    stack = std::make_unique<executor_stack>(*dev, so);
    exec = &stack->exec();

    x = t.add_tensor("x", n, tensor_kind::parameter);
    y = t.add_tensor("y", n, tensor_kind::parameter);
    a = t.add_tensor("a", n, tensor_kind::activation);
    b = t.add_tensor("b", n, tensor_kind::activation);
    c = t.add_tensor("c", n, tensor_kind::activation);
    w = t.add_tensor("w", n, tensor_kind::parameter);
    t.add_op("op0", {x}, {a});
    t.add_op("op1", {y}, {b});
    t.add_op("op2", {a, b}, {c});
    t.add_op("op3", {w, c}, {w});
    t.ops[0].recomputable = v.recompute;
    t.validate();
    p = plan::empty_for(t, "swaps both ways", so.device_budget);
    const evict_action out = where == tier::nvme ? evict_action::evict_to_nvme : evict_action::evict_to_host;
    p.initial_tier = {where, where, tier::device, tier::device, tier::device, where};
    p.steps[0].prefetches = {{x, where, 0}, {y, where, 1}};
    p.steps[0].evictions = {{x, evict_action::drop}, {a, out}};
    p.steps[1].prefetches = {{a, where, 2}};
    p.steps[1].evictions = {{y, evict_action::drop}};
    p.steps[2].prefetches = {{w, where, 3}};
    p.steps[3].evictions = {{w, out}};
    if (v.recompute) {
      p.steps[0].evictions = {{x, evict_action::drop}, {a, evict_action::drop}};
      p.steps[1].prefetches = {{x, where, 2}};
      p.steps[2].recomputes = {0};
      p.steps[2].evictions = {{x, evict_action::drop}};
      exec->set_rerun([this](op_index o) {
        EXPECT_EQ(o, 0u);
        ++reruns;
        launch_op0();
      });
    }

    for (tensor_id id = 0; id < t.tensors.size(); ++id) exec->define(id, t.tensors[id]);
    x_value.resize(n);
    y_value.resize(n);
    w_value.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      x_value[i] = static_cast<unsigned char>(i * 7 + 3);
      y_value[i] = static_cast<unsigned char>(i * 13 + 1);
      w_value[i] = static_cast<unsigned char>(i * 5 + 11);
    }
    exec->upload(x, x_value.data(), where);
    exec->upload(y, y_value.data(), where);
    exec->upload(w, w_value.data(), where);
    exec->follow(&t, &p);
    exec->set_timing(true);  // every op stamped too: more records for the device to refuse
  }

  // One iteration; c's value when it ran to the end, else nothing (the error is kept in `error`).
  std::vector<unsigned char> iteration() {
    error.clear();
    std::vector<unsigned char> out(n);
    try {
      exec->begin_iteration();
      const std::vector<tensor_id> r0{x}, w0{a};
      exec->begin_op(0, r0, w0, "op0");
      launch_op0();
      owner_code(0);
      exec->end_op(0);
      op(1, {y}, b, [](const unsigned char* in, unsigned char* o) {
        for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<unsigned char>(in[i] + 1);
      });
      const std::vector<tensor_id> reads{a, b}, writes{c};
      exec->begin_op(2, reads, writes, "op2");
      const auto* pa = static_cast<const unsigned char*>(exec->device_ptr(a));
      const auto* pb = static_cast<const unsigned char*>(exec->device_ptr(b));
      auto* pc = static_cast<unsigned char*>(exec->device_ptr(c));
      dev->launch_kernel(exec->compute_stream(), [pa, pb, pc, fails = failing_op == 2] {
        if (fails) throw io_error("op2's kernel failed (injected)", 0);
        for (std::size_t i = 0; i < n; ++i) pc[i] = static_cast<unsigned char>(pa[i] + pb[i]);
      });
      owner_code(2);
      exec->end_op(2);
      const std::vector<tensor_id> rw{w, c}, ww{w};
      exec->begin_op(3, rw, ww, "op3");
      auto* pw = static_cast<unsigned char*>(exec->device_ptr(w));
      const auto* pc2 = static_cast<const unsigned char*>(exec->device_ptr(c));
      dev->launch_kernel(exec->compute_stream(), [pw, pc2, fails = failing_op == 3] {
        if (fails) throw io_error("op3's kernel failed (injected)", 0);
        for (std::size_t i = 0; i < n; ++i) pw[i] = static_cast<unsigned char>(pw[i] + pc2[i]);
      });
      owner_code(3);
      exec->end_op(3);
      exec->read(c, out.data());
      exec->release(a);
      exec->release(b);
      exec->release(c);
      (void)exec->end_iteration();
      return out;
    } catch (const spillway::error& e) {
      error = e.what();
    }
    try {
      exec->abandon_op();  // where the error left an op's code: a launch the failed device refused
    } catch (const spillway::error& e) {
      EXPECT_EQ(dynamic_cast<const usage_error*>(&e), nullptr) << "abandoning the failed op: " << e.what();
    }
    try {
      (void)exec->end_iteration();
    } catch (const spillway::error& e) {
      // The iteration's error, or the device's again; never a complaint about the executor's use
      // of the device (a usage_error), which would mean a failure left its state half made.
      EXPECT_EQ(dynamic_cast<const usage_error*>(&e), nullptr) << "ending the failed iteration: " << e.what();
    }
    return {};
  }

  // The owner's own code after op k's launch, inside the op: throws where `throwing_op` says.
  void owner_code(int k) const {
    if (k == throwing_op) throw io_error("the owner's code in op" + std::to_string(k) + " failed (injected)", 0);
  }

  // Op 0's work, for its run and its reruns.
  void launch_op0() {
    const auto* in = static_cast<const unsigned char*>(exec->device_ptr(x));
    auto* o = static_cast<unsigned char*>(exec->device_ptr(a));
    dev->launch_kernel(exec->compute_stream(), [in, o, fails = failing_op == 0] {
      if (fails) throw io_error("op0's kernel failed (injected)", 0);
      for (std::size_t i = 0; i < n; ++i) o[i] = in[i] ^ 0x5a;
    });
  }

  template <class F>
  void op(op_index k, std::vector<tensor_id> reads, tensor_id out, F f) {
    const std::vector<tensor_id> writes{out};
    exec->begin_op(k, reads, writes, "op" + std::to_string(k));
    const auto* in = static_cast<const unsigned char*>(exec->device_ptr(reads[0]));
    auto* o = static_cast<unsigned char*>(exec->device_ptr(out));
    dev->launch_kernel(exec->compute_stream(), [in, o, f, k, fails = failing_op == static_cast<int>(k)] {
      if (fails) throw io_error("op" + std::to_string(k) + "'s kernel failed (injected)", 0);
      f(in, o);
    });
    owner_code(static_cast<int>(k));
    exec->end_op(k);
  }

  [[nodiscard]] std::vector<unsigned char> expected_c() const {
    std::vector<unsigned char> out(n);
    for (std::size_t i = 0; i < n; ++i)
      out[i] = static_cast<unsigned char>((x_value[i] ^ 0x5a) + static_cast<unsigned char>(y_value[i] + 1));
    return out;
  }

  // w after one more update by c (expected_c()).
  [[nodiscard]] std::vector<unsigned char> updated(std::vector<unsigned char> v) const {
    const auto add = expected_c();
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(v[i] + add[i]);
    return v;
  }

  [[nodiscard]] std::vector<unsigned char> value_of(tensor_id id) {
    std::vector<unsigned char> out(n);
    exec->read(id, out.data());
    return out;
  }

  test::temp_dir dir;
  std::unique_ptr<faulty_device> dev;
  std::unique_ptr<executor_stack> stack;
  executor* exec = nullptr;
  trace t;
  plan p;
  tensor_id x = 0, y = 0, a = 0, b = 0, c = 0, w = 0;
  std::vector<unsigned char> x_value, y_value, w_value;
  std::string error;
  int failing_op = -1;   // the op whose kernel throws: a failure of stream work, sticky
  int throwing_op = -1;  // the op whose owner code throws once its kernel is enqueued: the device is fine
  int reruns = 0;
};

void sweep(device_call call, variant where) {
  int failed_iterations = 0;
  for (std::uint64_t k = 0;; ++k) {
    SCOPED_TRACE(std::string(test::to_string(call)) + " number " + std::to_string(k) + " of the iteration fails");
    rig r(where);
    r.dev->fail(call, fault_rule{.skip = k, .count = 1});
    const auto c = r.iteration();
    const bool hit = r.dev->failures(call) > 0;
    r.dev->heal(call);
    if (!hit) {
      // Past the last such call of the iteration: it ran clean, and there was at least one.
      EXPECT_EQ(c, r.expected_c()) << r.error;
      EXPECT_EQ(r.value_of(r.w), r.updated(r.w_value)) << r.error;
      if (where.recompute) {
        EXPECT_EQ(r.reruns, 1) << "the plan's rerun of op 0 did not run";
      }
      ::testing::Test::RecordProperty(std::string(test::to_string(call)) + "_calls", static_cast<int>(k));
      EXPECT_GT(k, 0u) << "the iteration makes no " << test::to_string(call) << " call: the sweep tests nothing";
      break;
    }
    if (c.empty()) {
      ++failed_iterations;
    } else {
      EXPECT_EQ(c, r.expected_c()) << "a failed " << test::to_string(call) << " went unreported and c is wrong";
    }
    EXPECT_EQ(r.value_of(r.x), r.x_value) << "x lost its value; the iteration said: " << r.error;
    EXPECT_EQ(r.value_of(r.y), r.y_value) << "y lost its value; the iteration said: " << r.error;
    const auto w_now = r.value_of(r.w);
    EXPECT_TRUE(w_now == r.w_value || w_now == r.updated(r.w_value))
        << "w holds neither its value from before the iteration nor the updated one; the iteration said: " << r.error;
    const auto again = r.iteration();
    EXPECT_EQ(again, r.expected_c()) << "the next iteration, with the device answering, went wrong: " << r.error;
    EXPECT_EQ(r.value_of(r.w), r.updated(w_now)) << "the next iteration's update of w went wrong: " << r.error;
    if (::testing::Test::HasFailure()) break;  // one failing call is enough to read
  }
  ::testing::Test::RecordProperty("failed_iterations", failed_iterations);
  EXPECT_GT(failed_iterations, 0) << "no failure of " << test::to_string(call) << " was reported";
}

}  // namespace

class ExecutorDeviceFaults : public ::testing::TestWithParam<variant> {};

// The kernel of one op fails (on a GPU: an error that ends the context). The iteration reports
// that error, nothing waits for ever (ending the iteration, a second one, tearing it all down),
// and every later use of the device reports it again rather than going on with lost values.
TEST_P(ExecutorDeviceFaults, AKernelThatFailsIsReportedAndNothingHangs) {
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("op" + std::to_string(k) + "'s kernel fails");
    spillway::testing::watchdog dog("a failed kernel of op " + std::to_string(k), std::chrono::seconds(60));
    auto r = std::make_unique<rig>(GetParam());
    r->failing_op = k;
    EXPECT_TRUE(r->iteration().empty()) << "an iteration whose kernel failed returned a value";
    EXPECT_NE(r->error.find("kernel failed (injected)"), std::string::npos) << r->error;
    r->failing_op = -1;
    EXPECT_TRUE(r->iteration().empty()) << "the iteration after the failure ran on a failed device";
    EXPECT_NE(r->error.find("kernel failed (injected)"), std::string::npos) << r->error;
    r.reset();
  }
}

// The owner's code throws inside op k, its kernel enqueued, the device fine (Note [Abandoned ops]
// in prefetch/executor_failures.cpp): the owner abandons the op and ends the iteration, and the
// next iteration runs. No parameter lost its value: w, which op 3 updates in place, holds the
// update the abandoned op 3 enqueued, and its value from before where the iteration stopped
// earlier.
TEST_P(ExecutorDeviceFaults, AnOpThatTheOwnersCodeLeftIsAbandonedAndTheNextIterationRuns) {
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("the owner's code in op" + std::to_string(k) + " throws");
    spillway::testing::watchdog dog("an abandoned op " + std::to_string(k), std::chrono::seconds(60));
    rig r(GetParam());
    r.throwing_op = k;
    EXPECT_TRUE(r.iteration().empty()) << "an iteration whose owner threw returned a value";
    EXPECT_NE(r.error.find("failed (injected)"), std::string::npos) << r.error;
    EXPECT_EQ(r.value_of(r.x), r.x_value) << "x lost its value";
    EXPECT_EQ(r.value_of(r.y), r.y_value) << "y lost its value";
    const auto w_now = r.value_of(r.w);
    if (k == 3) {
      EXPECT_EQ(w_now, r.updated(r.w_value)) << "w lost the update its abandoned op enqueued";
    } else {
      EXPECT_EQ(w_now, r.w_value) << "w no longer holds its value from before the failed iteration";
    }
    r.throwing_op = -1;
    EXPECT_EQ(r.iteration(), r.expected_c()) << "the iteration after the abandoned op: " << r.error;
    EXPECT_EQ(r.value_of(r.w), r.updated(w_now)) << r.error;
  }
}

TEST_P(ExecutorDeviceFaults, EachCopyOfAnIterationFailingInTurn) { sweep(device_call::copy_async, GetParam()); }
TEST_P(ExecutorDeviceFaults, EachEventRecordOfAnIterationFailingInTurn) { sweep(device_call::record_event, GetParam()); }
TEST_P(ExecutorDeviceFaults, EachStreamWaitOfAnIterationFailingInTurn) {
  sweep(device_call::stream_wait_event, GetParam());
}
TEST_P(ExecutorDeviceFaults, EachEventCreationOfAnIterationFailingInTurn) {
  sweep(device_call::create_event, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Plans, ExecutorDeviceFaults,
                         ::testing::Values(variant{tier::host, false}, variant{tier::nvme, false},
                                           variant{tier::host, true}, variant{tier::nvme, true}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.where)) + (info.param.recompute ? "_recompute" : "_swap");
                         });

// The tier backing alone, over a faulty device: a host tier, one stream.
struct backing_rig {
  backing_rig()
      : dev(std::make_unique<cpu_device>()),
        pool(dev, {.capacity = 0, .region_size = 8_MiB, .alignment = 4096}),
        host(pool, 0),
        backing(dev, host, nullptr),
        s(dev) {
    for (std::size_t i = 0; i < n; ++i) value[i] = static_cast<unsigned char>(i * 3 + 7);
    d = dev.allocate(n);
    dev.copy_async(d, value.data(), n, copy_kind::host_to_device, s.get());
    dev.synchronize_stream(s.get());
  }
  ~backing_rig() { dev.deallocate(d, n); }
  faulty_device dev;
  pinned_host_pool pool;
  host_tier host;
  tier_backing backing;
  owned_stream s;
  std::vector<unsigned char> value = std::vector<unsigned char>(n);
  void* d = nullptr;
};

// A save whose copy the device refuses: the error reaches the caller, the tensor has no tier copy
// (none that a load could take for its value) and the host block it was to fill is given back.
TEST(TierBackingDeviceFaults, ASaveWhoseCopyIsRefusedLeavesNoCopyAndNoBlock) {
  backing_rig r;
  r.dev.fail(device_call::copy_async);
  EXPECT_THROW((void)r.backing.save(0, "x", r.d, n, tier::host, r.s.get()), cuda_error);
  r.dev.heal(device_call::copy_async);
  EXPECT_FALSE(r.backing.where(0).has_value()) << "a copy that was never made is listed as the tensor's";
  EXPECT_EQ(r.host.stats().used_bytes, 0u) << "the block of the refused save was not given back";
  r.backing.drain();  // nothing waits for ever on the failed move
  // The next save works and its copy holds the value.
  auto h = r.backing.save(0, "x", r.d, n, tier::host, r.s.get());
  h.wait();
  std::vector<unsigned char> back(n);
  r.backing.get(0, "x", back.data(), n);
  EXPECT_EQ(back, r.value);
}

// A save and a load whose event the device will not record: each waits for its copy instead, so
// the move is over and good when the call returns.
TEST(TierBackingDeviceFaults, MovesWhoseEventIsRefusedWaitForTheirCopy) {
  backing_rig r;
  r.dev.fail(device_call::record_event);
  auto saved = r.backing.save(0, "x", r.d, n, tier::host, r.s.get());
  EXPECT_TRUE(saved.ready()) << "the save returned before its copy was over, with no event to wait on";
  std::vector<unsigned char> back(n);
  r.backing.get(0, "x", back.data(), n);
  EXPECT_EQ(back, r.value);
  void* other = r.dev.allocate(n);
  auto loaded = r.backing.load(0, "x", other, n, r.s.get());
  EXPECT_TRUE(loaded.ready());
  EXPECT_GE(r.dev.failures(device_call::record_event), 2u);
  r.dev.heal(device_call::record_event);
  std::vector<unsigned char> there(n);
  r.dev.copy_async(there.data(), other, n, copy_kind::device_to_host, r.s.get());
  r.dev.synchronize_stream(r.s.get());
  EXPECT_EQ(there, r.value);
  r.dev.deallocate(other, n);
}

// The system will not pin more host memory, far below the host tier's capacity: the error says
// so, not that the host budget is too small.
TEST(TierBackingDeviceFaults, ARefusalToPinIsNotCalledAFullHostTier) {
  backing_rig r;
  r.dev.fail(device_call::allocate_pinned);
  try {
    (void)r.backing.save(0, "x", r.d, n, tier::host, r.s.get());
    ADD_FAILURE() << "the save found host memory the system refused";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("would not pin more host memory"), std::string::npos) << what;
    EXPECT_EQ(what.find("larger host budget"), std::string::npos) << what;
  }
  r.dev.heal(device_call::allocate_pinned);
  r.backing.drain();
}

// The executor when loads from a failing NVMe tier fail: the op that needed the value reports
// it, and no other load of that iteration that failed too may leave device memory standing in
// for the value, or its error standing for a later read the drive, answering again, can serve.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "../swap/swap_test_support.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/executor.hpp"
#include "prefetch/executor_stack.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr std::uint64_t n = 256_KiB;

// Two parameters on NVMe (the host tier holds neither), both prefetched before op 0; op 0
// reads y, op 1 reads x.
struct rig {
  rig() {
    device_options o;  // the strict cpu backend: every rule on
    o.cpu_device_memory = 64_MiB;
    dev = std::make_unique<cpu_device>(o);
    executor_stack_options so;
    so.device_budget = 4 * n;
    so.host_budget = 4_KiB;
    nvme_options no;
    no.directories = {dir.path()};
    no.reserve = 32_MiB;
    no.make_queue = test::faulty(faults);
    so.nvme = no;
    stack = std::make_unique<executor_stack>(*dev, so);
    exec = &stack->exec();

    x = t.add_tensor("x", n, tensor_kind::parameter);
    y = t.add_tensor("y", n, tensor_kind::parameter);
    a = t.add_tensor("a", 4_KiB, tensor_kind::activation);
    b = t.add_tensor("b", 4_KiB, tensor_kind::activation);
    t.add_op("op0", {y}, {a});
    t.add_op("op1", {x, a}, {b});
    t.validate();
    p = plan::empty_for(t, "both loads at op 0", 4 * n);
    p.initial_tier = {tier::nvme, tier::nvme, tier::device, tier::device};
    p.steps[0].prefetches = {{x, tier::nvme, 1}, {y, tier::nvme, 0}};
    p.steps[1].evictions = {{x, evict_action::drop}, {y, evict_action::drop}};

    for (tensor_id id = 0; id < t.tensors.size(); ++id) exec->define(id, t.tensors[id]);
    x_value = test::random_bytes(n, 1);
    y_value = test::random_bytes(n, 2);
    exec->upload(x, x_value.data(), tier::nvme);
    exec->upload(y, y_value.data(), tier::nvme);
    exec->follow(&t, &p);
  }
  // From now on every read from the swap file fails.
  void fail_reads() {
    faults->kind = io_kind::read;
    faults->error = EIO;
    faults->first = 1;
    faults->count = 0;
    faults->what = test::fault_plan::action::fail;
  }
  // Op 0 of an iteration with every read failing: the io_error its load of y raises.
  std::optional<std::string> failing_op0() {
    fail_reads();
    exec->begin_iteration();
    std::optional<std::string> error;
    try {
      const std::vector<tensor_id> reads{y}, writes{a};
      exec->begin_op(0, reads, writes, "op0");
      exec->end_op(0);
    } catch (const io_error& e) {
      error = e.what();
    }
    // The load of x, issued with y's, ends (and fails) while the drive still fails.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    faults->disarm();
    return error;
  }

  test::temp_dir dir;
  std::shared_ptr<test::fault_plan> faults = std::make_shared<test::fault_plan>();
  std::unique_ptr<cpu_device> dev;
  std::unique_ptr<executor_stack> stack;
  executor* exec = nullptr;
  trace t;
  plan p;
  tensor_id x = 0, y = 0, a = 0, b = 0;
  std::vector<unsigned char> x_value, y_value;
};

}  // namespace

TEST(ExecutorFaults, AReadAfterAFailedIterationGetsTheValueNotTheFailedLoadsMemory) {
  rig r;
  const auto error = r.failing_op0();
  ASSERT_TRUE(error.has_value()) << "op 0's load failed and nobody said so";
  EXPECT_NE(error->find("'y#"), std::string::npos) << *error;
  EXPECT_GT(r.faults->hits, 1u) << "x's load did not fail too: the test tests nothing";
  // The drive answers again; x was never read, and its value is on NVMe as it was.
  std::vector<unsigned char> back(n);
  r.exec->read(r.x, back.data());
  EXPECT_EQ(back, r.x_value);
  r.exec->read(r.y, back.data());
  EXPECT_EQ(back, r.y_value);
}

TEST(ExecutorFaults, AnIterationEndedAfterAFailedLoadLeavesNoDeviceCopyOfIt) {
  rig r;
  ASSERT_TRUE(r.failing_op0().has_value());
  try {
    (void)r.exec->end_iteration();
  } catch (const io_error&) {  // NOLINT(bugprone-empty-catch): a load's error may be reported here too
  }
  std::vector<unsigned char> back(n);
  r.exec->read(r.x, back.data());
  EXPECT_EQ(back, r.x_value);
  // The next iteration reads both values as they are on NVMe.
  r.exec->begin_iteration();
  for (op_index k = 0; k < 2; ++k) {
    const std::vector<tensor_id> reads = k == 0 ? std::vector<tensor_id>{r.y} : std::vector<tensor_id>{r.x, r.a};
    const std::vector<tensor_id> writes{k == 0 ? r.a : r.b};
    r.exec->begin_op(k, reads, writes, r.t.ops[k].name);
    const tensor_id in = k == 0 ? r.y : r.x;
    std::vector<unsigned char> seen(n);
    r.dev->copy_async(seen.data(), r.exec->device_ptr(in), n, copy_kind::device_to_host, r.exec->compute_stream());
    r.dev->synchronize_stream(r.exec->compute_stream());
    EXPECT_EQ(seen, k == 0 ? r.y_value : r.x_value) << r.t.ops[k].name;
    r.exec->end_op(k);
    if (k == 1) r.exec->release(r.a);
  }
  r.exec->release(r.b);
  EXPECT_NO_THROW((void)r.exec->end_iteration());
}

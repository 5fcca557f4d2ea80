// comm::collective_stream (Note [Collective streams]): jobs run in order, each after the device
// work enqueued before it, on a thread of their own; a failure fails the stream for good.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/collective_stream.hpp"
#include "device/device.hpp"
#include "device/error.hpp"
#include "../test_seed.hpp"

namespace spillway::comm {
namespace {

using namespace std::chrono_literals;

// On both backends: the stream's thread waits on real CUDA events where a GPU answers. Device
// work that takes a while is a host function on the stream (cudaLaunchHostFunc on a GPU).
class CollectiveStream : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "cuda" && !cuda_available()) GTEST_SKIP() << "no GPU answers";
    device_options o;
    o.cpu_device_memory = std::size_t{16} << 20;
    dev_ = make_device(GetParam(), o);
    s_ = dev_->create_stream();
  }
  void TearDown() override {
    if (!dev_) return;
    dev_->synchronize();
    dev_->destroy_stream(s_);
  }
  std::unique_ptr<Device> dev_;
  stream s_{};
};

// A job sees what the device wrote before it was queued, though the kernel was still running
// when enqueue() returned: the job waits for its event, not the caller.
TEST_P(CollectiveStream, AJobRunsAfterTheDeviceWorkBeforeIt) {
  collective_stream cs(*dev_);
  std::atomic<int> value{0};
  dev_->launch_host(s_, [&] {
    std::this_thread::sleep_for(50ms);
    value = 7;
  });
  int seen = -1;
  const auto t = cs.enqueue(s_, [&] { seen = value.load(); });
  cs.wait(t);
  EXPECT_EQ(seen, 7);
}

// The caller is not held back: enqueue returns while the device work it follows still runs.
TEST_P(CollectiveStream, EnqueueDoesNotWaitForTheDevice) {
  collective_stream cs(*dev_);
  std::atomic<bool> release{false};
  dev_->launch_host(s_, [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  std::atomic<bool> ran{false};
  const auto t = cs.enqueue(s_, [&] { ran = true; });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ran.load());  // the kernel before it has not finished
  EXPECT_EQ(cs.done(), 0u);
  release = true;
  cs.wait(t);
  EXPECT_TRUE(ran.load());
}

// Property: random jobs behind random device work run one at a time, in the order queued, each
// after the kernel queued before it; tickets count from 1.
TEST_P(CollectiveStream, RandomJobsRunInOrder) {
  std::mt19937 rng(spillway::test::test_seed(11));
  for (int round = 0; round < 5; ++round) {
    collective_stream cs(*dev_);
    std::vector<int> order;
    std::atomic<int> kernels_done{0};
    std::atomic<int> running{0};
    bool overlapped = false;
    const int n = 5 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) {
      const auto us = std::chrono::microseconds(rng() % 500);
      dev_->launch_host(s_, [&, us] {
        std::this_thread::sleep_for(us);
        ++kernels_done;
      });
      const auto t = cs.enqueue(s_, [&, i] {
        if (++running != 1) overlapped = true;
        EXPECT_GE(kernels_done.load(), i + 1) << "job " << i << " ran before its kernel";
        order.push_back(i);
        --running;
      });
      EXPECT_EQ(t, static_cast<collective_stream::ticket>(i + 1));
      if (rng() % 4 == 0) cs.wait(t);
    }
    cs.wait_all();
    EXPECT_FALSE(overlapped);
    ASSERT_EQ(order.size(), static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
    EXPECT_EQ(cs.queued(), static_cast<std::uint64_t>(n));
    EXPECT_EQ(cs.done(), static_cast<std::uint64_t>(n));
  }
}

// The first job to throw fails the stream: later jobs are dropped, and every wait and enqueue
// from then on throws its error.
TEST_P(CollectiveStream, AFailedJobFailsTheStream) {
  collective_stream cs(*dev_);
  // The device holds every job back until all three are queued.
  std::atomic<bool> go{false};
  dev_->launch_host(s_, [&] {
    while (!go) std::this_thread::sleep_for(1ms);
  });
  const auto first = cs.enqueue(s_, [] {});
  const auto bad = cs.enqueue(s_, [] { throw std::runtime_error("rank 1 did not answer"); });
  std::atomic<bool> later_ran{false};
  const auto later = cs.enqueue(s_, [&] { later_ran = true; });
  go = true;
  EXPECT_THROW(cs.wait(later), std::runtime_error);
  EXPECT_FALSE(later_ran.load());
  EXPECT_THROW(cs.wait(bad), std::runtime_error);
  EXPECT_THROW(cs.wait(first), std::runtime_error);  // the stream is failed for good
  try {
    (void)cs.enqueue(s_, [] {});
    ADD_FAILURE() << "enqueue after a failure";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "rank 1 did not answer");
  }
  EXPECT_EQ(cs.done(), 1u);
}

TEST_P(CollectiveStream, BadInputIsRefused) {
  collective_stream cs(*dev_);
  EXPECT_THROW((void)cs.enqueue(s_, {}), usage_error);
  try {
    cs.wait(3);
    ADD_FAILURE() << "no error";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("ticket 3 was never given (0 jobs queued)"), std::string::npos) << e.what();
  }
  cs.wait_all();  // nothing queued: returns at once
}

// The destructor runs what is queued before it returns.
TEST_P(CollectiveStream, DestructionRunsQueuedJobs) {
  std::atomic<int> ran{0};
  {
    collective_stream cs(*dev_);
    dev_->launch_host(s_, [] { std::this_thread::sleep_for(20ms); });
    for (int i = 0; i < 4; ++i) (void)cs.enqueue(s_, [&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 4);
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveStream, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace spillway::comm

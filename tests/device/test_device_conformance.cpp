// The Device contract, checked on every backend: the cpu backend always, cuda where a GPU answers
// (those instances skip here and still compile).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

class DeviceConformance : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "cuda" && !cuda_available()) GTEST_SKIP() << "no GPU answers";
    device_options o;
    o.cpu_device_memory = 256_MiB;
    dev_ = make_device(GetParam(), o);
  }
  std::unique_ptr<Device> dev_;
};

TEST_P(DeviceConformance, PropertiesDescribeTheDevice) {
  const auto& p = dev_->properties();
  EXPECT_FALSE(p.name.empty());
  EXPECT_EQ(std::string(to_string(p.backend)), GetParam());
  EXPECT_GT(p.total_memory, 0u);
  EXPECT_GE(p.copy_engines, 1);
  EXPECT_GE(p.numa_node, -1);
}

TEST_P(DeviceConformance, RoundTripThroughDeviceMemory) {
  owned_stream s(*dev_);
  std::mt19937 rng(spillway::test::test_seed(1));
  for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{4096}, std::size_t{3_MiB + 17}}) {
    std::vector<unsigned char> in(n), out(n, 0);
    for (auto& b : in) b = static_cast<unsigned char>(rng());
    void* d = dev_->allocate(n);
    void* d2 = dev_->allocate(n);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d) % 256, 0u);
    dev_->copy_async(d, in.data(), n, copy_kind::host_to_device, s);
    dev_->copy_async(d2, d, n, copy_kind::device_to_device, s);
    dev_->copy_async(out.data(), d2, n, copy_kind::device_to_host, s);
    dev_->synchronize_stream(s);
    EXPECT_EQ(in, out) << "size " << n;
    dev_->deallocate(d, n);
    dev_->deallocate(d2, n);
  }
}

TEST_P(DeviceConformance, MemsetFillsBytes) {
  owned_stream s(*dev_);
  const std::size_t n = 10000;
  void* d = dev_->allocate(n);
  std::vector<unsigned char> out(n, 0);
  dev_->memset_async(d, 0xAB, n, s);
  dev_->copy_async(out.data(), d, n, copy_kind::device_to_host, s);
  dev_->synchronize_stream(s);
  for (auto b : out) ASSERT_EQ(b, 0xAB);
  dev_->deallocate(d, n);
}

TEST_P(DeviceConformance, AllocationPastCapacityFailsAsOutOfMemoryAndDeviceStillWorks) {
  const std::size_t too_much = dev_->properties().total_memory + 1_GiB;
  EXPECT_THROW((void)dev_->allocate(too_much), out_of_memory);
  void* d = dev_->allocate(1_MiB);
  EXPECT_NE(d, nullptr);
  dev_->deallocate(d, 1_MiB);
}

TEST_P(DeviceConformance, PinnedMemoryIsPageAlignedAndCopiesBothWays) {
  owned_stream s(*dev_);
  const std::size_t n = 1_MiB + 3;
  auto* h = static_cast<unsigned char*>(dev_->allocate_pinned(n));
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(h) % 4096, 0u);
  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<unsigned char>(i * 7);
  void* d = dev_->allocate(n);
  dev_->copy_async(d, h, n, copy_kind::host_to_device, s);
  dev_->memset_async(h, 0, 0, s);
  dev_->synchronize_stream(s);
  std::memset(h, 0, n);
  dev_->copy_async(h, d, n, copy_kind::device_to_host, s);
  dev_->synchronize_stream(s);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], static_cast<unsigned char>(i * 7));
  dev_->deallocate(d, n);
  dev_->deallocate_pinned(h, n);
}

TEST_P(DeviceConformance, StreamRunsWorkInOrder) {
  owned_stream s(*dev_, stream_priority::high);
  std::vector<int> seen;
  for (int i = 0; i < 200; ++i) dev_->launch_host(s, [&seen, i] { seen.push_back(i); });
  dev_->synchronize_stream(s);
  std::vector<int> want(200);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(seen, want);
}

TEST_P(DeviceConformance, EventMarksAStreamPosition) {
  owned_stream s(*dev_);
  owned_event e(*dev_);
  EXPECT_TRUE(dev_->query_event(e)) << "an event never recorded counts as finished";
  std::atomic<bool> release{false};
  dev_->launch_kernel(s, [&] { while (!release.load()) std::this_thread::yield(); });
  dev_->record_event(e, s);
  EXPECT_FALSE(dev_->query_event(e));
  release = true;
  dev_->synchronize_event(e);
  EXPECT_TRUE(dev_->query_event(e));
  dev_->synchronize_stream(s);
}

TEST_P(DeviceConformance, StreamWaitEventOrdersWorkAcrossStreams) {
  owned_stream a(*dev_), b(*dev_);
  owned_event e(*dev_);
  std::atomic<bool> release{false};
  std::atomic<int> order{0};
  int a_done = -1, b_done = -1;
  dev_->launch_kernel(a, [&] {
    while (!release.load()) std::this_thread::yield();
    a_done = order++;
  });
  dev_->record_event(e, a);
  dev_->stream_wait_event(b, e);
  dev_->launch_host(b, [&] { b_done = order++; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(b_done, -1) << "b ran before the event it waits on";
  release = true;
  dev_->synchronize();
  EXPECT_EQ(a_done, 0);
  EXPECT_EQ(b_done, 1);
}

TEST_P(DeviceConformance, AWaitKeepsTheRecordItCapturedWhenTheEventIsRecordedAgainElsewhere) {
  // An event pool re-records an event on another stream while an earlier record may still be
  // pending; a wait enqueued before must still wait for the earlier record.
  owned_stream slow(*dev_), idle(*dev_), waiter(*dev_);
  owned_event e(*dev_);
  std::atomic<bool> slow_done{false};
  std::atomic<bool> early{false};
  dev_->launch_kernel(slow, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    slow_done = true;
  });
  dev_->record_event(e, slow);
  dev_->stream_wait_event(waiter, e);
  dev_->launch_kernel(waiter, [&] { early = !slow_done.load(); });
  dev_->record_event(e, idle);  // reached at once: says nothing of the record on `slow`
  dev_->synchronize();
  EXPECT_FALSE(early.load()) << "the wait ended on the later record, before the slow stream got there";
}

TEST_P(DeviceConformance, FailureInStreamWorkIsRethrownOnSynchronizeAndStays) {
  owned_stream s(*dev_);
  dev_->launch_host(s, [] { throw io_error("injected failure", 5); });
  EXPECT_THROW(dev_->synchronize_stream(s), io_error) << "the stream does not hang";
  EXPECT_THROW(dev_->synchronize_stream(s), io_error) << "the failure is sticky, as a CUDA context's";
}

TEST_P(DeviceConformance, ManyStreamsCopyConcurrentlyWithoutMixingBytes) {
  constexpr int streams = 6;
  constexpr std::size_t n = 256_KiB;
  std::vector<owned_stream> ss;
  for (int i = 0; i < streams; ++i) ss.emplace_back(*dev_);
  std::vector<std::vector<unsigned char>> in(streams, std::vector<unsigned char>(n));
  std::vector<std::vector<unsigned char>> out(streams, std::vector<unsigned char>(n));
  std::vector<void*> d(streams);
  for (int i = 0; i < streams; ++i) {
    std::fill(in[i].begin(), in[i].end(), static_cast<unsigned char>(i + 1));
    d[i] = dev_->allocate(n);
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 20; ++round) {
        dev_->copy_async(d[i], in[i].data(), n, copy_kind::host_to_device, ss[i]);
        dev_->copy_async(out[i].data(), d[i], n, copy_kind::device_to_host, ss[i]);
      }
      dev_->synchronize_stream(ss[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < streams; ++i) {
    EXPECT_EQ(in[i], out[i]);
    dev_->deallocate(d[i], n);
  }
}

TEST(MakeDevice, UnknownKindIsAClearError) {
  try {
    (void)make_device("tpu");
    FAIL();
  } catch (const config_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown backend \"tpu\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"auto\", \"cpu\" or \"cuda\""), std::string::npos) << msg;  // what would be right
    EXPECT_EQ(msg.find("[at "), std::string::npos) << msg;  // bad input: no source location
  }
  if (!cuda_available()) {
    EXPECT_THROW((void)make_device("cuda"), config_error);
  }
  EXPECT_NE(make_device("auto"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceConformance, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return std::string(info.param); });

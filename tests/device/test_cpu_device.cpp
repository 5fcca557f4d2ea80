// What only the cpu backend promises: a hard capacity, copy engines per direction, a link
// bandwidth that holds copies to size / bandwidth, and streams that can be made slow on purpose.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

using namespace spillway;
using namespace spillway::literals;
using clk = std::chrono::steady_clock;

namespace {
// Pinned host bytes, so that copies are asynchronous (pageable ones are not, as on CUDA).
struct pinned_bytes {
  pinned_bytes(Device& d, std::size_t n, char fill = 0) : dev(d), p(static_cast<char*>(d.allocate_pinned(n))), bytes(n) {
    std::fill(p, p + n, fill);
  }
  ~pinned_bytes() { dev.deallocate_pinned(p, bytes); }
  pinned_bytes(const pinned_bytes&) = delete;
  pinned_bytes& operator=(const pinned_bytes&) = delete;
  [[nodiscard]] char* data() const { return p; }
  [[nodiscard]] std::size_t size() const { return bytes; }
  Device& dev;
  char* p;
  std::size_t bytes;
};
}  // namespace

TEST(CpuDevice, DefaultCapacityIsOneGiBAndCanBeSetByOptionNotByEnvironment) {
  // The environment is read once, by session_config; the device takes only its options.
  setenv("SPILLWAY_CPU_DEVICE_MEMORY", "96MiB", 1);
  EXPECT_EQ(cpu_device().properties().total_memory, 1_GiB);
  unsetenv("SPILLWAY_CPU_DEVICE_MEMORY");
  device_options o;
  o.cpu_device_memory = 64_MiB;
  EXPECT_EQ(cpu_device(o).properties().total_memory, 64_MiB);
}

TEST(CpuDevice, CapacityIsHardAndExactlyAccounted) {
  device_options o;
  o.cpu_device_memory = 1_MiB;
  cpu_device dev(o);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(dev.allocate(256_KiB));
  EXPECT_EQ(dev.used_memory(), 1_MiB);
  EXPECT_EQ(dev.free_memory(), 0u);
  try {
    (void)dev.allocate(1);
    FAIL() << "allocation past capacity succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
  dev.deallocate(blocks.back(), 256_KiB);
  blocks.pop_back();
  EXPECT_EQ(dev.used_memory(), 768_KiB);
  EXPECT_EQ(dev.free_memory(), 256_KiB);
  blocks.push_back(dev.allocate(200_KiB));  // fits again
  for (auto* b : blocks) dev.deallocate(b, 0);
  EXPECT_EQ(dev.used_memory(), 0u);
  EXPECT_EQ(dev.free_memory(), 1_MiB);
}

TEST(CpuDevice, LinkBandwidthHoldsACopyToSizeOverBandwidth) {
  device_options o;
  o.h2d_bytes_per_second = 100e6;  // 4 MiB at 100 MB/s: at least 41.9 ms
  cpu_device dev(o);
  owned_stream s(dev);
  std::vector<char> h(4_MiB, 1);
  void* d = dev.allocate(h.size());
  const auto t0 = clk::now();
  dev.copy_async(d, h.data(), h.size(), copy_kind::host_to_device, s);
  dev.synchronize_stream(s);
  EXPECT_GE(clk::now() - t0, std::chrono::microseconds(41900));
  EXPECT_EQ(dev.copied_bytes(copy_kind::host_to_device), 4_MiB);
  dev.deallocate(d, h.size());
}

// A timed copy moves its bytes at the end of its link time, as a GPU's destination is only
// whole when the copy ends: code that reads the destination early, or changes the source before
// the copy is done, sees it go wrong here rather than only on a GPU.
TEST(CpuDevice, ATimedCopyLandsAtTheEndOfItsLinkTime) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "reads the destination and writes the source while a copy runs, on purpose: a race by design";
#endif
  device_options o;
  o.h2d_bytes_per_second = 50e6;  // 4 MiB at 50 MB/s: about 84 ms
  cpu_device dev(o);
  owned_stream s(dev);
  pinned_bytes h(dev, 4_MiB, 1);
  auto* d = static_cast<char*>(dev.allocate(h.size()));
  dev.memset_async(d, 0, h.size(), s);
  dev.synchronize_stream(s);
  for (int round = 0; round < 2; ++round) {  // the second copy sleeps by the first's memcpy rate
    dev.memset_async(d, 0, h.size(), s);
    dev.copy_async(d, h.data(), h.size(), copy_kind::host_to_device, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(d[0], 0) << "round " << round << ": the destination changed a third of the way into the copy";
    EXPECT_EQ(d[h.size() - 1], 0) << "round " << round;
    std::fill(h.data(), h.data() + h.size(), static_cast<char>(2 + round));  // before the copy is done
    dev.synchronize_stream(s);
    EXPECT_EQ(d[0], 2 + round) << "round " << round << ": the copy read its source before its end";
    EXPECT_EQ(d[h.size() - 1], 2 + round) << "round " << round;
  }
  dev.deallocate(d, h.size());
}

// What stream work captures is destroyed on the stream's thread before the work counts as
// done: once synchronize_stream returns, no capture outlives it (a buffer's owner may go).
TEST(CpuDevice, StreamWorksCapturesAreGoneWhenTheStreamIsSynchronized) {
  cpu_device dev;
  owned_stream s(dev);
  std::atomic<bool> destroyed{false};
  struct slow_to_die {
    std::atomic<bool>* flag;
    ~slow_to_die() {
      if (flag == nullptr) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      *flag = true;
    }
  };
  auto capture = std::make_shared<slow_to_die>(slow_to_die{&destroyed});
  dev.launch_kernel(s, [capture] {});
  capture.reset();
  dev.synchronize_stream(s);
  EXPECT_TRUE(destroyed.load()) << "synchronize_stream returned before the kernel's captures were destroyed";
}

TEST(CpuDevice, BurstOfCopiesIsNeverFasterThanTheLink) {
  // 40 copies of 256 KiB back to back at 2 GB/s: 5.24 ms of link time. Each copy's deadline
  // follows the previous one's, so the burst is never faster than the link, less the 200 us a
  // burst may start early by. (How much slower it may be depends on the machine's load; the
  // replay bench measures that against the simulator.)
  device_options o;
  o.h2d_bytes_per_second = 2e9;
  cpu_device dev(o);
  owned_stream s(dev);
  pinned_bytes h(dev, 256_KiB, 1);
  void* d = dev.allocate(h.size());
  constexpr int copies = 40;
  const double ideal_us = copies * static_cast<double>(h.size()) / 2e9 * 1e6;
  const auto t0 = clk::now();
  for (int i = 0; i < copies; ++i) dev.copy_async(d, h.data(), h.size(), copy_kind::host_to_device, s);
  dev.synchronize_stream(s);
  const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
  EXPECT_GE(us, ideal_us - 200) << "a burst of copies ran faster than the link";
  EXPECT_EQ(dev.copied_bytes(copy_kind::host_to_device), copies * 256_KiB);
  dev.deallocate(d, h.size());
}

TEST(CpuDevice, OppositeDirectionsOverlapWhileOneDirectionTakesTurns) {
  device_options o;
  o.h2d_bytes_per_second = 20e6;  // 8 MiB: about 420 ms
  o.d2h_bytes_per_second = 1e9;   // 1 MiB: about 1 ms
  cpu_device dev(o);
  owned_stream a(dev), b(dev), c(dev);
  owned_event slow_done(dev), fast_done(dev);
  pinned_bytes h(dev, 8_MiB, 2), back(dev, 1_MiB);
  void* d = dev.allocate(h.size());
  void* other = dev.allocate(back.size());
  dev.copy_async(d, h.data(), h.size(), copy_kind::host_to_device, a);
  dev.record_event(slow_done, a);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  dev.copy_async(back.data(), other, back.size(), copy_kind::device_to_host, b);
  dev.record_event(fast_done, b);
  dev.synchronize_event(fast_done);
  EXPECT_FALSE(dev.query_event(slow_done)) << "the D2H copy waited for the H2D engine";

  // Two copies in one direction on two streams take turns on the one engine.
  const auto t0 = clk::now();
  dev.copy_async(d, h.data(), 2_MiB, copy_kind::host_to_device, b);
  dev.copy_async(static_cast<char*>(d) + 2_MiB, h.data(), 2_MiB, copy_kind::host_to_device, c);
  dev.synchronize();
  const auto both = clk::now() - t0;
  EXPECT_GE(both, std::chrono::microseconds(2 * 104800 - 1000)) << "same-direction copies overlapped";
  dev.deallocate(d, h.size());
  dev.deallocate(other, back.size());
}

TEST(CpuDevice, SlowStreamTakesAtLeastItsDelayPerItem) {
  cpu_device dev;
  owned_stream s(dev);
  dev.set_stream_delay(s, std::chrono::milliseconds(15));
  const auto t0 = clk::now();
  for (int i = 0; i < 4; ++i) dev.launch_kernel(s, [] {});
  dev.synchronize_stream(s);
  EXPECT_GE(clk::now() - t0, std::chrono::milliseconds(60));
}

TEST(CpuDevice, EventDestroyedWhileRecordedWorkIsQueuedIsSafe) {
  cpu_device dev;
  owned_stream s(dev);
  dev.set_stream_delay(s, std::chrono::milliseconds(5));
  for (int i = 0; i < 50; ++i) {
    event e = dev.create_event();
    dev.launch_kernel(s, [] {});
    dev.record_event(e, s);
    dev.stream_wait_event(s, e);
    dev.destroy_event(e);
  }
  dev.synchronize_stream(s);
  SUCCEED();
}

TEST(CpuDevice, NegativeBandwidthIsRefused) {
  cpu_device dev;
  EXPECT_THROW(dev.set_link_bandwidth(-1, 0), config_error);
  try {
    dev.set_link_bandwidth(0, -2);
    ADD_FAILURE() << "a negative d2h bandwidth was accepted";
  } catch (const config_error& e) {  // names the option and the value; bad input has no source location
    const std::string msg = e.what();
    EXPECT_NE(msg.find("d2h_bytes_per_second"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("[at "), std::string::npos) << msg;
  }
}

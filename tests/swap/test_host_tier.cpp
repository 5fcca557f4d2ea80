// Host tier: pinned, aligned blocks from the pool, its own capacity, and an out-of-memory
// message that diagnoses (tensor, requested, capacity, used, free).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "../device/faulty_device.hpp"
#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "swap/host_tier.hpp"

using namespace spillway;
using namespace spillway::literals;

TEST(HostTier, BlocksAreAlignedAndAccountedAsThePoolRoundsThem) {
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 8_MiB, .alignment = 4096});
  host_tier tier(pool, 4_MiB);
  void* a = tier.allocate("a", 1);
  void* b = tier.allocate("b", 5000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 4096, 0u);
  std::memset(b, 7, 5000);
  EXPECT_EQ(tier.stats().used_bytes, 4096u + 8192u);
  EXPECT_EQ(tier.stats().blocks, 2u);
  tier.deallocate(a, 1);
  tier.deallocate(b, 5000);
  EXPECT_EQ(tier.stats().used_bytes, 0u);
  EXPECT_EQ(tier.stats().peak_used_bytes, 12288u);
  EXPECT_EQ(tier.allocate("empty", 0), nullptr);
}

TEST(HostTier, FullTierIsOutOfMemoryWithADiagnosis) {
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 8_MiB, .alignment = 4096});
  host_tier tier(pool, 1_MiB);
  void* a = tier.allocate("first", 768_KiB);
  try {
    (void)tier.allocate("second", 512_KiB);
    FAIL() << "no error";
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'second'"), std::string::npos) << m;
    EXPECT_NE(m.find("capacity 1.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("used 768.00 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("free 256.00 KiB"), std::string::npos) << m;
  }
  void* c = tier.allocate("third", 256_KiB);  // what is left still works
  tier.deallocate(a, 768_KiB);
  tier.deallocate(c, 256_KiB);
}

TEST(HostTier, PoolExhaustionIsReportedWithTheTensorName) {
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 2_MiB, .region_size = 2_MiB, .alignment = 4096});
  host_tier tier(pool, 0);  // no capacity of its own: the pool's limit applies
  void* a = tier.allocate("a", 2_MiB);
  try {
    (void)tier.allocate("b", 4096);
    FAIL() << "no error";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pinned host pool"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tier.stats().used_bytes, 2_MiB);
  tier.deallocate(a, 2_MiB);
}

TEST(HostTier, ThePeakStaysAfterAFreeAndASmallerAllocation) {
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 8_MiB, .alignment = 4096});
  host_tier tier(pool, 4_MiB);
  void* a = tier.allocate("a", 1_MiB);
  void* b = tier.allocate("b", 4096);
  EXPECT_EQ(tier.stats().peak_used_bytes, 1_MiB + 4096);
  tier.deallocate(a, 1_MiB);
  EXPECT_EQ(tier.stats().peak_used_bytes, 1_MiB + 4096) << "a free lowered the peak";
  void* c = tier.allocate("c", 8192);
  EXPECT_EQ(tier.stats().used_bytes, 3u * 4096);
  EXPECT_EQ(tier.stats().peak_used_bytes, 1_MiB + 4096) << "a smaller allocation lowered the peak";
  tier.deallocate(b, 4096);
  tier.deallocate(c, 8192);
}

// The pool may pin a region for a new block (slow on a GPU): the tier counts the block first and
// takes it outside its lock, so a free and a stats() on other threads do not wait for the pinning.
TEST(HostTier, AFreeOnAnotherThreadDoesNotWaitForAnAllocationsPinning) {
  test::faulty_device dev(std::make_unique<cpu_device>());
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 1_MiB});
  host_tier tier(pool, 8_MiB);
  void* kept = tier.allocate("kept", 256_KiB);  // the first region, pinned before the hook is set
  std::atomic<bool> pinning{false}, go_on{false};
  dev.before_pinning = [&] {
    pinning = true;
    while (!go_on) std::this_thread::yield();
  };
  std::thread grow([&] { tier.deallocate(tier.allocate("big", 2_MiB), 2_MiB); });  // a region of its own
  while (!pinning) std::this_thread::yield();
  std::atomic<bool> freed{false};
  std::thread release([&] {
    tier.deallocate(kept, 256_KiB);
    (void)tier.stats();
    freed = true;
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!freed && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  const bool waited = !freed;
  go_on = true;
  grow.join();
  release.join();
  EXPECT_FALSE(waited) << "a free waited for another thread's pinning";
  EXPECT_EQ(tier.stats().used_bytes, 0u);
  EXPECT_EQ(tier.stats().blocks, 0u);
}


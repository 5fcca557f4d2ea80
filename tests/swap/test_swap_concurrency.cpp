// The NVMe tier read and written from many threads at once through several rings; every byte
// compared. (Moves of many tensors between the device and both tiers from several threads:
// tests/prefetch/test_tier_backing.cpp, TierBackingConcurrency.)
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "device/units.hpp"
#include "swap/nvme_tier.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

TEST(SwapConcurrency, TierReadsAndWritesFromManyThreadsAtOnce) {
  test::temp_dir dir;
  nvme_options o;
  o.directories = {dir.path()};
  o.reserve = 128_MiB;
  o.block_size = 128_KiB;
  o.rings = 3;
  o.queue_depth = 8;
  nvme_tier tier(o);
  std::vector<std::thread> workers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 6; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        const auto data = test::random_bytes(300_KiB * (i + 1) + t, t * 10 + i);
        const std::string name = "w" + std::to_string(t) + "_" + std::to_string(i);
        tier.write(name, data.data(), data.size()).wait();
        std::vector<unsigned char> back(data.size());
        tier.read(name, back.data()).wait();
        if (back != data) bad.fetch_add(1);
        tier.erase(name);
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(tier.stats().free_bytes, tier.stats().capacity_bytes);
}

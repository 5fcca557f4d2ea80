// measure_speed: the NVMe tier's own rates, measured through its files and leaving nothing behind.
#include <gtest/gtest.h>

#include <cmath>

#include "allocator/pinned_host_pool.hpp"
#include "device/device.hpp"
#include "device/units.hpp"
#include "swap/nvme_speed.hpp"
#include "swap/nvme_tier.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;
using spillway::test::temp_dir;

namespace {

nvme_options options_for(std::vector<std::string> dirs, std::uint64_t reserve) {
  nvme_options o;
  o.directories = std::move(dirs);
  o.reserve = reserve;
  return o;
}

}  // namespace

TEST(NvmeSpeed, MeasuresBothWaysAndLeavesTheTierAsItWas) {
  auto dev = make_device("cpu");
  temp_dir a, b;
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 32_MiB, .alignment = 4096});
  nvme_tier tier(options_for({a.path(), b.path()}, 64_MiB), &pool);
  const auto before = tier.stats();
  const nvme_speed s = measure_speed(tier, pool, 16_MiB);
  EXPECT_EQ(s.bytes, 16_MiB);
  EXPECT_TRUE(std::isfinite(s.read_bytes_per_s) && s.read_bytes_per_s > 0);
  EXPECT_TRUE(std::isfinite(s.write_bytes_per_s) && s.write_bytes_per_s > 0);
  const auto after = tier.stats();
  EXPECT_EQ(after.tensors, 0u);
  EXPECT_EQ(after.stored_bytes, 0u);
  EXPECT_EQ(after.free_bytes, before.free_bytes);
  EXPECT_EQ(after.bytes_written - before.bytes_written, 16_MiB);
  EXPECT_EQ(after.bytes_read - before.bytes_read, 16_MiB);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

TEST(NvmeSpeed, MeasuresWithWholeStripesOfWhatIsFree) {
  auto dev = make_device("cpu");
  temp_dir a, b;
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 32_MiB, .alignment = 4096});
  nvme_tier tier(options_for({a.path(), b.path()}, 6_MiB), &pool);  // 3 blocks of 1 MiB per file
  const nvme_speed s = measure_speed(tier, pool, 16_MiB);
  EXPECT_EQ(s.bytes, 6_MiB);
  // A tier with a tensor filling it has no room: nothing is measured, nothing is touched.
  std::vector<unsigned char> data(6_MiB, 7);
  tier.write("full", data.data(), data.size()).wait();
  const nvme_speed none = measure_speed(tier, pool, 16_MiB);
  EXPECT_EQ(none.bytes, 0u);
  EXPECT_EQ(none.read_bytes_per_s, 0);
  EXPECT_TRUE(tier.contains("full"));
  EXPECT_FALSE(tier.contains("spillway nvme speed test"));
}

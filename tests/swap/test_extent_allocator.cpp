// Extent allocator: first fit, one extent when a run fits, several when fragmented, nothing
// taken when full, merging on free; and a random property test against a bitmap.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "swap/extent_allocator.hpp"
#include "../test_seed.hpp"

using namespace spillway;

TEST(ExtentAllocator, FirstFitInOneExtent) {
  extent_allocator a(100);
  EXPECT_EQ(a.allocate(10), (std::vector<extent>{{0, 10}}));
  EXPECT_EQ(a.allocate(20), (std::vector<extent>{{10, 20}}));
  EXPECT_EQ(a.free_blocks(), 70u);
  EXPECT_EQ(a.largest_free_extent(), 70u);
}

TEST(ExtentAllocator, FullMeansEmptyResultAndNothingTaken) {
  extent_allocator a(10);
  (void)a.allocate(8);
  EXPECT_TRUE(a.allocate(3).empty());
  EXPECT_EQ(a.free_blocks(), 2u);
  EXPECT_TRUE(a.allocate(0).empty());
}

TEST(ExtentAllocator, FragmentedSpaceIsUsedAsSeveralExtents) {
  extent_allocator a(10);
  auto x = a.allocate(2);  // 0-1
  auto y = a.allocate(2);  // 2-3
  auto z = a.allocate(2);  // 4-5
  (void)a.allocate(2);     // 6-7
  a.deallocate(x[0]);
  a.deallocate(z[0]);
  // Free: [0,2) [4,6) [8,10): no run of 5, but 6 blocks free in all.
  const auto got = a.allocate(5);
  EXPECT_EQ(got, (std::vector<extent>{{0, 2}, {4, 2}, {8, 1}}));
  EXPECT_EQ(a.free_blocks(), 1u);
  (void)y;
}

TEST(ExtentAllocator, FreeMergesWithBothNeighbours) {
  extent_allocator a(9);
  auto x = a.allocate(3);
  auto y = a.allocate(3);
  auto z = a.allocate(3);
  a.deallocate(x[0]);
  a.deallocate(z[0]);
  EXPECT_EQ(a.free_extents(), 2u);
  a.deallocate(y[0]);
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_EQ(a.largest_free_extent(), 9u);
}

TEST(ExtentAllocator, RandomAllocFreeMatchesABitmap) {
  constexpr std::uint64_t blocks = 512;
  extent_allocator a(blocks);
  std::vector<bool> used(blocks, false);
  std::vector<std::vector<extent>> live;
  std::mt19937 rng(spillway::test::test_seed(42));
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::uint64_t n = 1 + rng() % 40;
      auto got = a.allocate(n);
      const auto free_before = static_cast<std::uint64_t>(std::count(used.begin(), used.end(), false));
      if (got.empty()) {
        ASSERT_LT(free_before, n);
        continue;
      }
      std::uint64_t total = 0;
      for (const auto& e : got) {
        for (auto b = e.first; b < e.first + e.count; ++b) {
          ASSERT_LT(b, blocks);
          ASSERT_FALSE(used[b]) << "block " << b << " handed out twice";
          used[b] = true;
        }
        total += e.count;
      }
      ASSERT_EQ(total, n);
      live.push_back(got);
    } else {
      const std::size_t k = rng() % live.size();
      for (const auto& e : live[k]) {
        a.deallocate(e);
        for (auto b = e.first; b < e.first + e.count; ++b) used[b] = false;
      }
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    ASSERT_EQ(a.free_blocks(), static_cast<std::uint64_t>(std::count(used.begin(), used.end(), false)));
  }
  for (const auto& l : live)
    for (const auto& e : l) a.deallocate(e);
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_EQ(a.free_blocks(), blocks);
}

TEST(ExtentAllocator, GrowAddsBlocksAtTheEndMergedWithAFreeTail) {
  extent_allocator a(8);
  const auto head = a.allocate(6);  // blocks 0..5 taken, 6..7 free
  ASSERT_EQ(head.size(), 1u);
  a.grow(8);
  EXPECT_EQ(a.total_blocks(), 16u);
  EXPECT_EQ(a.free_blocks(), 10u);
  EXPECT_EQ(a.free_extents(), 1u);  // 6..15 as one run
  EXPECT_EQ(a.largest_free_extent(), 10u);
  const auto got = a.allocate(10);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], (extent{6, 10}));
  EXPECT_TRUE(a.allocate(1).empty());
  a.grow(0);
  EXPECT_EQ(a.total_blocks(), 16u);
}

TEST(ExtentAllocator, AnExactFitRunIsTakenWholeAfterAShorterRun) {
  extent_allocator a(5);
  std::vector<extent> one;
  for (int i = 0; i < 5; ++i) one.push_back(a.allocate(1).at(0));
  a.deallocate(one[0]);
  a.deallocate(one[2]);
  a.deallocate(one[3]);
  // Free: [0,1) [2,4): the second run fits 2 blocks exactly.
  ASSERT_EQ(a.free_extents(), 2u);
  EXPECT_EQ(a.allocate(2), (std::vector<extent>{{2, 2}}));
  EXPECT_EQ(a.free_blocks(), 1u);
  EXPECT_EQ(a.largest_free_extent(), 1u);
}

// Freeing what is already free, or what this allocator never gave out, aborts.
class ExtentAllocatorDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(ExtentAllocatorDeathTest, FreeingAnExtentTwiceAborts) {
  EXPECT_DEATH(
      {
        extent_allocator a(10);
        const auto x = a.allocate(4);
        a.deallocate(x[0]);
        a.deallocate(x[0]);
      },
      "");
}

TEST_F(ExtentAllocatorDeathTest, FreeingAnExtentWhoseLastBlockIsFreeAborts) {
  EXPECT_DEATH(
      {
        extent_allocator a(10);
        (void)a.allocate(3);  // 0-2
        (void)a.allocate(3);  // 3-5, and 6-9 stay free
        a.deallocate({4, 3});  // block 6 is already free
      },
      "");
}

TEST_F(ExtentAllocatorDeathTest, FreeingAnExtentWhoseFirstBlockIsFreeAborts) {
  EXPECT_DEATH(
      {
        extent_allocator a(10);
        const auto x = a.allocate(3);  // 0-2
        (void)a.allocate(3);           // 3-5
        a.deallocate(x[0]);
        a.deallocate({2, 2});  // block 2 is already free
      },
      "");
}

TEST_F(ExtentAllocatorDeathTest, FreeingPastTheLastBlockAborts) {
  EXPECT_DEATH(
      {
        extent_allocator a(10);
        (void)a.allocate(10);
        a.deallocate({8, 3});
      },
      "");
}

// Arena allocator: random allocate/free over several streams against a reference model (no
// overlap, patterns kept, exact accounting, full coalescing), and the cross-stream handoff.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "allocator/arena_allocator.hpp"
#include "allocator/device_resource.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {
std::size_t round_up(std::size_t n) { return device_budget::placed(n); }

/// A cpu device of `memory` bytes and the device resource an arena reserves its region from.
struct device_rig {
  explicit device_rig(std::size_t memory = 16_MiB) : dev(options(memory)), up(dev) {}
  static device_options options(std::size_t memory) {
    device_options o;
    o.cpu_device_memory = memory;
    return o;
  }
  cpu_device dev;
  device_resource up;
};
}  // namespace

TEST(ArenaAllocator, RandomOpsAgainstAReferenceModel) {
  device_rig rig(64_MiB);
  auto& [dev, up] = rig;
  constexpr std::size_t capacity = 8_MiB;
  auto arena = std::make_unique<arena_allocator>(dev, up, device_budget(capacity));
  std::vector<owned_stream> streams;
  for (int i = 0; i < 3; ++i) streams.emplace_back(dev);
  struct live {
    std::size_t bytes;
    int stream;
    unsigned char tag;
  };
  std::map<std::uintptr_t, live> ref;  // by address
  std::mt19937 rng(spillway::test::test_seed(99));
  std::size_t allocated = 0;
  auto bad = std::make_shared<std::atomic<int>>(0);
  int ooms = 0;
  for (int op = 0; op < 20000; ++op) {
    const bool do_alloc = ref.empty() || rng() % 100 < 55;
    if (do_alloc) {
      const std::size_t bytes = 1 + rng() % (rng() % 8 == 0 ? 1_MiB : 16_KiB);
      const int si = static_cast<int>(rng() % 3);
      void* p = nullptr;
      try {
        p = arena->allocate(bytes, streams[si]);
      } catch (const out_of_memory&) {
        ++ooms;
        EXPECT_GT(allocated + round_up(bytes), capacity / 4) << "refused with most of the arena free";
        continue;
      }
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      ASSERT_EQ(a % 256, 0u);
      auto next = ref.lower_bound(a);
      if (next != ref.end()) {
        ASSERT_LE(a + bytes, next->first) << "overlaps the next live block";
      }
      if (next != ref.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.bytes, a) << "overlaps the previous live block";
      }
      const auto tag = static_cast<unsigned char>(op);
      ref[a] = live{bytes, si, tag};
      allocated += round_up(bytes);
      dev.launch_kernel(streams[si], [p, bytes, tag] { std::memset(p, tag, bytes); });
    } else {
      auto it = ref.begin();
      std::advance(it, rng() % ref.size());
      auto* p = reinterpret_cast<unsigned char*>(it->first);
      const live l = it->second;
      dev.launch_kernel(streams[l.stream], [p, l, bad] {
        for (std::size_t i = 0; i < l.bytes; ++i)
          if (p[i] != l.tag) {
            ++*bad;
            break;
          }
      });
      arena->deallocate(p, l.bytes, streams[l.stream]);
      allocated -= round_up(l.bytes);
      ref.erase(it);
    }
    ASSERT_EQ(arena->stats().allocated_bytes, allocated);
  }
  for (auto& [a, l] : ref) arena->deallocate(reinterpret_cast<void*>(a), l.bytes, streams[l.stream]);
  dev.synchronize();
  EXPECT_EQ(bad->load(), 0) << "a live block was overwritten by another";
  const auto st = arena->stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.largest_free_bytes, capacity) << "free neighbours were not merged back into one region";
  EXPECT_LE(st.peak_allocated_bytes, capacity);
  for (auto& s : streams) arena->forget_stream(s);
}

TEST(ArenaAllocator, BlockFreedOnASlowStreamWaitsBeforeAnotherStreamUsesIt) {
  device_rig rig;
  auto& [dev, up] = rig;
  arena_allocator arena(dev, up, device_budget(1_MiB));
  owned_stream slow(dev), fast(dev);
  dev.set_stream_delay(slow, std::chrono::milliseconds(50));
  std::atomic<bool> slow_done{false};
  std::atomic<bool> early{false};
  void* p = arena.allocate(1_MiB, slow);  // the whole arena: the next request must reuse it
  dev.launch_kernel(slow, [&] { slow_done = true; });
  arena.deallocate(p, 1_MiB, slow);
  void* q = arena.allocate(1_MiB, fast);
  EXPECT_EQ(p, q);
  dev.launch_kernel(fast, [&] { early = !slow_done.load(); });
  dev.synchronize();
  EXPECT_FALSE(early.load()) << "the fast stream used the block before the slow stream was done";
  EXPECT_GE(arena.stats().stream_handoffs, 1u);
  arena.deallocate(q, 1_MiB, fast);
  arena.forget_stream(slow);
  arena.forget_stream(fast);
}

TEST(ArenaAllocator, BadCapacityAndExhaustionAreClearErrors) {
  device_rig rig;
  auto& [dev, up] = rig;
  EXPECT_THROW(arena_allocator(dev, up, device_budget(0)), config_error);
  EXPECT_THROW(arena_allocator(dev, up, device_budget(32_MiB)), config_error);
  arena_allocator arena(dev, up, device_budget(1_MiB));
  void* a = arena.allocate(600_KiB, stream{});
  try {
    (void)arena.allocate(600_KiB, stream{});
    FAIL();
  } catch (const out_of_memory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("largest free block"), std::string::npos) << msg;
    EXPECT_NE(msg.find("budget 1.00 MiB"), std::string::npos) << msg;
  }
  arena.deallocate(a, 600_KiB, stream{});
}

// try_allocate_at against a reference model: it succeeds exactly when the rounded range is inside
// the region and overlaps no live block, and then returns that very address; mixed with best-fit
// allocations and frees, blocks never overlap and the region merges back into one.
TEST(ArenaAllocator, AllocateAtTakesExactlyTheRangeAskedForWhenItIsFree) {
  device_rig rig;
  auto& [dev, up] = rig;
  constexpr std::size_t capacity = 2_MiB;
  arena_allocator arena(dev, up, device_budget(capacity));
  std::map<std::size_t, std::size_t> live;  // offset -> rounded bytes
  std::map<std::size_t, void*> where;
  std::mt19937 rng(spillway::test::test_seed(7));
  auto overlaps = [&](std::size_t off, std::size_t n) {
    auto it = live.upper_bound(off);
    if (it != live.end() && it->first < off + n) return true;
    if (it != live.begin() && std::prev(it)->first + std::prev(it)->second > off) return true;
    return false;
  };
  int placed = 0, refused = 0;
  for (int op = 0; op < 20000; ++op) {
    const unsigned r = rng() % 100;
    if (r < 40 || live.empty()) {
      const std::size_t bytes = 1 + rng() % 64_KiB;
      const std::size_t off = (rng() % (capacity / arena_allocator::granule + 8)) * arena_allocator::granule;
      const bool free_range = off + round_up(bytes) <= capacity && !overlaps(off, round_up(bytes));
      void* p = arena.try_allocate_at(off, bytes, stream{});
      ASSERT_EQ(p != nullptr, free_range) << "offset " << off << ", " << bytes << " bytes";
      if (p == nullptr) {
        ++refused;
        continue;
      }
      ++placed;
      ASSERT_EQ(arena.offset_of(p), off);
      live[off] = round_up(bytes);
      where[off] = p;
    } else if (r < 60) {
      const std::size_t bytes = 1 + rng() % 64_KiB;
      void* p = nullptr;
      try {
        p = arena.allocate(bytes, stream{});
      } catch (const out_of_memory&) {
        continue;
      }
      const std::size_t off = arena.offset_of(p);
      ASSERT_FALSE(overlaps(off, round_up(bytes))) << "best fit handed out a live range";
      live[off] = round_up(bytes);
      where[off] = p;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      arena.deallocate(where.at(it->first), it->second, stream{});
      where.erase(it->first);
      live.erase(it);
    }
  }
  EXPECT_GT(placed, 1000);
  EXPECT_GT(refused, 1000);
  for (auto& [off, p] : where) arena.deallocate(p, live.at(off), stream{});
  EXPECT_EQ(arena.stats().allocated_bytes, 0u);
  EXPECT_EQ(arena.stats().largest_free_bytes, capacity) << "free neighbours were not merged back into one region";
}

// Free neighbours merge, but each keeps the range its last user touched: carving bytes out of the
// merged block waits only for the earlier users of those bytes, not for a slow stream that used
// the bytes beside them.
TEST(ArenaAllocator, CarvedBlockWaitsOnlyForTheEarlierUsersOfItsOwnBytes) {
  device_rig rig;
  auto& [dev, up] = rig;
  arena_allocator arena(dev, up, device_budget(2_MiB));
  owned_stream slow(dev), fast(dev), third(dev);
  void* b = arena.try_allocate_at(0, 1_MiB, fast);
  void* a = arena.try_allocate_at(1_MiB, 1_MiB, slow);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::atomic<bool> slow_done{false};
  dev.launch_kernel(slow, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    slow_done = true;
  });
  arena.deallocate(a, 1_MiB, slow);
  arena.deallocate(b, 1_MiB, fast);
  dev.synchronize_stream(fast);
  ASSERT_EQ(arena.stats().largest_free_bytes, 2_MiB) << "the two blocks did not merge";

  std::atomic<bool> waited_for_slow{false};
  void* c = arena.allocate(1_MiB, third);  // best fit carves the head of the merged block: b's bytes
  ASSERT_EQ(c, b);
  dev.launch_kernel(third, [&] { waited_for_slow = slow_done.load(); });
  dev.synchronize_stream(third);
  EXPECT_FALSE(waited_for_slow.load()) << "the new block waited for a stream that never touched its bytes";

  std::atomic<bool> early{false};
  void* d = arena.try_allocate_at(1_MiB, 1_MiB, third);  // a's bytes: must wait for the slow stream
  ASSERT_EQ(d, a);
  dev.launch_kernel(third, [&] { early = !slow_done.load(); });
  dev.synchronize();
  EXPECT_FALSE(early.load()) << "the block was reused before the slow stream was done with it";
  arena.deallocate(c, 1_MiB, third);
  arena.deallocate(d, 1_MiB, third);
  for (auto* s : {&slow, &fast, &third}) arena.forget_stream(*s);
}

// set_budget: refused while a block is live (a misuse), refused past the device (bad input, the
// old region stays usable), and otherwise a fresh region of the new size, empty and whole.
TEST(ArenaAllocator, SetBudgetReservesANewRegionOnlyWhenEmpty) {
  device_rig rig;
  auto& [dev, up] = rig;
  owned_stream s(dev);
  arena_allocator arena(dev, up, device_budget(2_MiB));
  void* p = arena.allocate(1_MiB, s);
  EXPECT_THROW(arena.set_budget(device_budget(4_MiB)), usage_error);
  arena.deallocate(p, 1_MiB, s);
  EXPECT_THROW(arena.set_budget(device_budget(32_MiB)), config_error);
  EXPECT_EQ(arena.budget().bytes(), 2_MiB);
  void* q = arena.allocate(2_MiB, s);  // the old region still serves all of itself
  arena.deallocate(q, 2_MiB, s);

  arena.set_budget(device_budget(5_MiB));
  EXPECT_EQ(arena.budget().bytes(), 5_MiB);
  EXPECT_EQ(arena.capacity(), 5_MiB);
  EXPECT_EQ(arena.stats().largest_free_bytes, 5_MiB);
  EXPECT_EQ(arena.stats().allocated_bytes, 0u);
  void* r = arena.allocate(5_MiB, s);
  EXPECT_THROW((void)arena.allocate(512, s), out_of_memory);
  arena.deallocate(r, 5_MiB, s);
  arena.set_budget(device_budget(1_MiB));
  EXPECT_EQ(arena.capacity(), 1_MiB);
  arena.forget_stream(s);
}

// The budget's rules, checked against the arithmetic they replace: placed() rounds up to the
// granule, planning_bytes() leaves 1/32 doubled per step and never more than 1/4, and admits()
// is the plain sum.
TEST(DeviceBudget, PlacedPlanningAndAdmitsFollowTheHeadroomRule) {
  EXPECT_EQ(device_budget::placed(1), device_budget::granule);
  EXPECT_EQ(device_budget::placed(device_budget::granule), device_budget::granule);
  EXPECT_EQ(device_budget::placed(device_budget::granule + 1), 2 * device_budget::granule);
  std::mt19937_64 rng(spillway::test::test_seed(7));
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t b = 1 + rng() % (std::uint64_t{1} << 44);
    const device_budget budget(b);
    for (int d = 0; d <= device_budget::max_margin_doublings + 2; ++d) {
      const double share = std::min(0.25, (1.0 / 32) * static_cast<double>(std::uint64_t{1} << d));
      EXPECT_EQ(budget.planning_bytes(d), b - static_cast<std::uint64_t>(share * static_cast<double>(b))) << b << " " << d;
    }
    const std::uint64_t used = rng() % (b + 1);
    EXPECT_TRUE(budget.admits(used, b - used));
    EXPECT_FALSE(budget.admits(used, b - used + 1));
  }
  device_rig rig;
  auto& dev = rig.dev;
  EXPECT_THROW(device_budget(17_MiB).check_fits(dev), config_error);
  EXPECT_THROW(device_budget(0).check_fits(dev), config_error);
  EXPECT_NO_THROW(device_budget(16_MiB).check_fits(dev));
  EXPECT_EQ(device_budget::of_free_memory(dev).bytes() % device_budget::granule, 0u);
  EXPECT_LE(device_budget::of_free_memory(dev).bytes(), 16_MiB);
}

// try_allocate_high takes the end of the highest free block that holds the request: the top of
// the region when it is free, else lower down; nullptr (and nothing changed) when no block holds it.
TEST(ArenaAllocator, AllocateHighTakesTheTopOfTheHighestFreeBlockThatFits) {
  device_rig rig;
  auto& [dev, up] = rig;
  owned_stream s(dev);
  arena_allocator arena(dev, up, device_budget(1_MiB));
  auto* base = static_cast<std::byte*>(arena.allocate(256_KiB, s));  // best fit: the bottom
  ASSERT_EQ(arena.offset_of(base), 0u);
  void* top = arena.try_allocate_high(100, s);
  EXPECT_EQ(arena.offset_of(top), 1_MiB - arena_allocator::granule) << "not the top granule";
  void* mid = arena.try_allocate_at(512_KiB, 256_KiB, s);  // splits the free middle
  ASSERT_NE(mid, nullptr);
  // Free now: [256, 512) KiB and [768 KiB, 1 MiB - 512): 200 KiB goes to the top of the higher,
  // 256 KiB fits only the lower, and then nothing holds 128 KiB.
  void* low = arena.try_allocate_high(200_KiB, s);
  EXPECT_EQ(arena.offset_of(low), 1_MiB - arena_allocator::granule - 200_KiB);
  void* fits_lower = arena.try_allocate_high(256_KiB, s);
  EXPECT_EQ(arena.offset_of(fits_lower), 256_KiB);
  const auto before = arena.stats();
  EXPECT_EQ(arena.try_allocate_high(128_KiB, s), nullptr);
  EXPECT_EQ(arena.stats().allocated_bytes, before.allocated_bytes);
  for (auto [p, n] : {std::pair<void*, std::size_t>{base, 256_KiB}, {top, 100}, {mid, 256_KiB}, {low, 200_KiB},
                      {fits_lower, 256_KiB}})
    arena.deallocate(p, n, s);
  EXPECT_EQ(arena.stats().largest_free_bytes, 1_MiB);
  arena.forget_stream(s);
}

// A budget that is not a multiple of the granule reserves up to the next granule, and the whole
// budget can be allocated as one block.
TEST(ArenaAllocator, ABudgetOffTheGranuleIsRoundedUpAndServesItselfWhole) {
  device_rig rig;
  auto& [dev, up] = rig;
  owned_stream s(dev);
  arena_allocator arena(dev, up, device_budget(1_MiB + 100));
  EXPECT_EQ(arena.capacity(), 1_MiB + arena_allocator::granule);
  EXPECT_EQ(arena.stats().capacity_bytes, 1_MiB + arena_allocator::granule);
  void* p = arena.allocate(1_MiB + 100, s);
  EXPECT_EQ(arena.offset_of(p), 0u);
  EXPECT_EQ(arena.stats().largest_free_bytes, 0u);
  arena.deallocate(p, 1_MiB + 100, s);
  arena.forget_stream(s);
}

TEST(ArenaAllocator, AllocateAtAnOffsetOffTheGranuleIsAUsageError) {
  device_rig rig;
  auto& [dev, up] = rig;
  arena_allocator arena(dev, up, device_budget(1_MiB));
  EXPECT_THROW((void)arena.try_allocate_at(100, 512, stream{}), usage_error);
  EXPECT_THROW((void)arena.try_allocate_at(arena_allocator::granule + 1, 512, stream{}), usage_error);
  EXPECT_EQ(arena.stats().allocated_bytes, 0u) << "a refused placement took bytes";
  void* p = arena.try_allocate_at(arena_allocator::granule, 512, stream{});
  ASSERT_NE(p, nullptr);
  arena.deallocate(p, 512, stream{});
}

// largest_free_bytes is the largest of the free blocks, and the peak stays after frees.
TEST(ArenaAllocator, StatisticsReportTheLargestFreeBlockAndKeepThePeak) {
  device_rig rig;
  auto& [dev, up] = rig;
  arena_allocator arena(dev, up, device_budget(1_MiB));
  void* a = arena.try_allocate_at(0, 256_KiB, stream{});
  void* b = arena.try_allocate_at(256_KiB, 256_KiB, stream{});
  void* c = arena.try_allocate_at(512_KiB, 512_KiB, stream{});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(arena.stats().largest_free_bytes, 0u);
  EXPECT_EQ(arena.stats().peak_allocated_bytes, 1_MiB);
  arena.deallocate(a, 256_KiB, stream{});
  arena.deallocate(c, 512_KiB, stream{});
  // Free: [0, 256 KiB) and [512 KiB, 1 MiB), split by b.
  auto st = arena.stats();
  EXPECT_EQ(st.largest_free_bytes, 512_KiB);
  EXPECT_EQ(st.allocated_bytes, 256_KiB);
  EXPECT_EQ(st.peak_allocated_bytes, 1_MiB) << "a free lowered the peak";
  void* d = arena.allocate(100_KiB, stream{});
  st = arena.stats();
  EXPECT_EQ(st.allocated_bytes, 356_KiB);
  EXPECT_EQ(st.peak_allocated_bytes, 1_MiB) << "a smaller allocation lowered the peak";
  EXPECT_EQ(st.largest_free_bytes, 512_KiB) << "best fit took the smaller free block";
  arena.deallocate(b, 256_KiB, stream{});
  arena.deallocate(d, 100_KiB, stream{});
  EXPECT_EQ(arena.stats().largest_free_bytes, 1_MiB);
  EXPECT_EQ(arena.stats().peak_allocated_bytes, 1_MiB);
}

// Of two free blocks of the same size, the one whose last user is done is handed out: the new
// stream needs no wait. The busy one was freed first, so plain best fit would pick it.
TEST(ArenaAllocator, AmongEqualFreeBlocksOneWithNoPendingUserIsPreferred) {
  device_rig rig;
  auto& [dev, up] = rig;
  arena_allocator arena(dev, up, device_budget(1_MiB));
  owned_stream busy(dev), idle(dev), third(dev);
  std::atomic<bool> release{false};
  // Lets the busy stream finish however the test ends, before the arena waits for its frees.
  struct releaser {
    std::atomic<bool>& flag;
    Device& dev;
    ~releaser() {
      flag = true;
      dev.synchronize();
    }
  } guard{release, dev};
  void* a = arena.try_allocate_at(0, 256_KiB, busy);
  void* x = arena.try_allocate_at(256_KiB, 256_KiB, idle);
  void* b = arena.try_allocate_at(512_KiB, 256_KiB, idle);
  void* y = arena.try_allocate_at(768_KiB, 256_KiB, idle);
  ASSERT_TRUE(a && x && b && y);
  dev.launch_kernel(busy, [&release] { while (!release.load()) std::this_thread::yield(); });
  arena.deallocate(a, 256_KiB, busy);  // its event waits behind the kernel
  arena.deallocate(b, 256_KiB, idle);
  dev.synchronize_stream(idle);
  const auto handoffs = arena.stats().stream_handoffs;
  void* c = arena.allocate(256_KiB, third);
  EXPECT_EQ(c, b) << "the block still in use by the busy stream was handed out";
  EXPECT_EQ(arena.stats().stream_handoffs, handoffs) << "the new block waits for another stream";
  release = true;
  dev.synchronize();
  arena.deallocate(c, 256_KiB, third);
  arena.deallocate(x, 256_KiB, idle);
  arena.deallocate(y, 256_KiB, idle);
  for (auto* s : {&busy, &idle, &third}) arena.forget_stream(*s);
}

// When the device cannot give the new region (other allocations hold its memory), set_budget
// reports it and the arena keeps its old budget and region, whole and usable.
TEST(ArenaAllocator, ABudgetTheDeviceCannotGiveLeavesTheOldOneInPlace) {
  device_rig rig;  // 16 MiB of device memory
  auto& [dev, up] = rig;
  owned_stream s(dev);
  arena_allocator arena(dev, up, device_budget(2_MiB));
  void* other = dev.allocate(10_MiB);  // held outside the arena
  EXPECT_THROW(arena.set_budget(device_budget(8_MiB)), out_of_memory);
  EXPECT_EQ(arena.budget().bytes(), 2_MiB);
  EXPECT_EQ(arena.capacity(), 2_MiB);
  auto* p = static_cast<char*>(arena.allocate(2_MiB, s));
  dev.memset_async(p, 1, 2_MiB, s);
  dev.synchronize_stream(s);
  EXPECT_EQ(p[2_MiB - 1], 1);
  arena.deallocate(p, 2_MiB, s);
  arena.forget_stream(s);
  dev.deallocate(other, 10_MiB);
}

// forget_stream (the stream is about to be destroyed) returns only when the work its freed
// blocks wait for is done: after it, nothing is left to wait on that stream.
TEST(ArenaAllocator, ForgettingAStreamWaitsForItsWork) {
  device_rig rig;
  auto& [dev, up] = rig;
  arena_allocator arena(dev, up, device_budget(1_MiB));
  owned_stream s(dev);
  std::atomic<bool> go{false}, done{false};
  void* p = arena.allocate(256_KiB, s);
  dev.launch_kernel(s, [&] {
    while (!go) std::this_thread::yield();
    done = true;
  });
  arena.deallocate(p, 256_KiB, s);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    go = true;
  });
  arena.forget_stream(s);
  const bool finished = done.load();
  release.join();
  dev.synchronize_stream(s);
  EXPECT_TRUE(finished) << "forget_stream returned while the stream's work was still running";
}

// The allocators when the device says no: an event that cannot be made or recorded at a free, a
// handoff wait the device refuses, a device that failed before a free, and a system that will
// not pin more host memory. Each keeps its blocks accounted for and reports a clear error, and
// none of them ends the process.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../device/faulty_device.hpp"
#include "allocator/arena_allocator.hpp"
#include "allocator/device_resource.hpp"
#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

using namespace spillway;
using namespace spillway::literals;
using test::device_call;
using test::faulty_device;

namespace {

// A strict cpu device (every rule on) behind a faulty_device, and an arena over all of it.
struct rig {
  explicit rig(std::size_t arena_bytes = 1_MiB) {
    device_options o;
    o.cpu_device_memory = 16_MiB;
    auto cpu = std::make_unique<cpu_device>(o);
    dev = std::make_unique<faulty_device>(std::move(cpu));
    up = std::make_unique<device_resource>(*dev);
    arena = std::make_unique<arena_allocator>(*dev, *up, device_budget(arena_bytes));
  }
  std::unique_ptr<faulty_device> dev;
  std::unique_ptr<device_resource> up;
  std::unique_ptr<arena_allocator> arena;
};

// A free whose event the device will not give or record: the next user of the block, on another
// stream, must still not run before the freeing stream's work is done.
void expect_a_free_without_its_event_is_still_safe(device_call refused) {
  rig r;
  owned_stream slow(*r.dev), fast(*r.dev);
  std::atomic<bool> slow_done{false}, early{false};
  void* p = r.arena->allocate(1_MiB, slow);  // the whole arena: the next request reuses it
  r.dev->launch_kernel(slow, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    slow_done = true;
  });
  r.dev->fail(refused);
  r.arena->deallocate(p, 1_MiB, slow);
  EXPECT_EQ(r.dev->failures(refused), 1u) << test::to_string(refused) << " was never asked for at the free";
  r.dev->heal(refused);
  void* q = r.arena->allocate(1_MiB, fast);
  EXPECT_EQ(p, q);
  r.dev->launch_kernel(fast, [&] { early = !slow_done.load(); });
  r.dev->synchronize();
  EXPECT_FALSE(early.load()) << "the block went to another stream before the freeing stream was done with it";
  r.arena->deallocate(q, 1_MiB, fast);
  r.arena->forget_stream(slow);
  r.arena->forget_stream(fast);
}

}  // namespace

TEST(ArenaDeviceFaults, AFreeWhoseEventCannotBeRecordedWaitsForTheStream) {
  expect_a_free_without_its_event_is_still_safe(device_call::record_event);
}

TEST(ArenaDeviceFaults, AFreeWhoseEventCannotBeMadeWaitsForTheStream) {
  expect_a_free_without_its_event_is_still_safe(device_call::create_event);
}

// The device refuses the wait a handoff needs: the allocation fails with the device's error, and
// the block stays free, findable and merged with its neighbours, for the next request.
TEST(ArenaDeviceFaults, AHandoffWaitTheDeviceRefusesLeavesTheBlockFree) {
  rig r(2_MiB);
  owned_stream slow(*r.dev), fast(*r.dev);
  std::atomic<bool> release{false};
  void* a = r.arena->allocate(1_MiB, slow);
  void* b = r.arena->allocate(1_MiB, slow);
  r.dev->launch_kernel(slow, [&] {
    while (!release.load()) std::this_thread::yield();
  });
  r.arena->deallocate(a, 1_MiB, slow);  // pending on the slow stream: a handoff needs a wait
  r.dev->fail(device_call::stream_wait_event);
  EXPECT_THROW((void)r.arena->allocate(1_MiB, fast), cuda_error);
  r.dev->heal(device_call::stream_wait_event);
  auto st = r.arena->stats();
  EXPECT_EQ(st.allocated_bytes, 1_MiB) << "the refused allocation kept its block";
  EXPECT_EQ(st.largest_free_bytes, 1_MiB) << "the block the refused allocation chose left the free index";
  r.arena->deallocate(b, 1_MiB, slow);
  EXPECT_EQ(r.arena->stats().largest_free_bytes, 2_MiB) << "the block was not merged with its freed neighbour";
  void* c = r.arena->allocate(2_MiB, fast);
  EXPECT_EQ(c, a);
  release = true;
  r.arena->deallocate(c, 2_MiB, fast);
  r.dev->synchronize();
  r.arena->forget_stream(slow);
  r.arena->forget_stream(fast);
}

// The same with the head of a free block split off first (a placement at an offset, as a layout
// asks for): the refused allocation leaves one free block, not a head and a tail apart.
TEST(ArenaDeviceFaults, ARefusedPlacementAtAnOffsetLeavesOneFreeBlock) {
  rig r(2_MiB);
  owned_stream slow(*r.dev), fast(*r.dev);
  std::atomic<bool> release{false};
  void* a = r.arena->allocate(2_MiB, slow);
  r.dev->launch_kernel(slow, [&] {
    while (!release.load()) std::this_thread::yield();
  });
  r.arena->deallocate(a, 2_MiB, slow);
  r.dev->fail(device_call::stream_wait_event);
  EXPECT_THROW((void)r.arena->try_allocate_at(1_MiB, 512_KiB, fast), cuda_error);
  r.dev->heal(device_call::stream_wait_event);
  auto st = r.arena->stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.largest_free_bytes, 2_MiB) << "the refused placement left the free region in pieces";
  release = true;
  r.dev->synchronize();
  r.arena->forget_stream(slow);
  r.arena->forget_stream(fast);
}

// After stream work failed (a sticky error: every later query of an event throws), freeing blocks
// still works: a free is noexcept, and pruning a block's many pending events must not throw out
// of it. The arena stays consistent.
TEST(ArenaDeviceFaults, FreesAfterTheDeviceFailedKeepTheArenaConsistent) {
  rig r(4_MiB);
  owned_stream held(*r.dev), broken(*r.dev);
  std::atomic<bool> release{false};
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(r.arena->allocate(256_KiB, held));
  r.dev->launch_kernel(held, [&] {
    while (!release.load()) std::this_thread::yield();
  });
  // Frees in address order: each merges with the one before, so one block gathers 16 pending
  // events, and pruning them starts once they are more than 8.
  for (int i = 0; i < 8; ++i) r.arena->deallocate(blocks[static_cast<std::size_t>(i)], 256_KiB, held);
  r.dev->launch_kernel(broken, [] { throw io_error("injected kernel failure", 5); });
  EXPECT_THROW(r.dev->synchronize_stream(broken), io_error);
  owned_event probe(*r.dev);
  EXPECT_THROW((void)r.dev->query_event(probe.get()), io_error) << "the failure is not sticky";
  for (int i = 8; i < 16; ++i) r.arena->deallocate(blocks[static_cast<std::size_t>(i)], 256_KiB, held);
  release = true;
  auto st = r.arena->stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.largest_free_bytes, 4_MiB) << "the frees after the failure did not merge back into one region";
}

// The device will not give the budget's region (another process took the memory): a clear
// out_of_memory that names the budget and says what to do; set_budget keeps the old region.
TEST(ArenaDeviceFaults, ARegionTheDeviceWillNotGiveIsAClearError) {
  device_options o;
  o.cpu_device_memory = 16_MiB;
  faulty_device dev(std::make_unique<cpu_device>(o));
  device_resource up(dev);
  dev.fail(device_call::allocate);
  try {
    arena_allocator arena(dev, up, device_budget(4_MiB));
    ADD_FAILURE() << "the arena was made without its region";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("device budget of 4.00 MiB"), std::string::npos) << what;
    EXPECT_NE(what.find("give a smaller device budget"), std::string::npos) << what;
    EXPECT_NE(what.find("refused (injected)"), std::string::npos) << "the device's own error is lost: " << what;
  }
  dev.heal(device_call::allocate);
  arena_allocator arena(dev, up, device_budget(4_MiB));
  dev.fail(device_call::allocate, {.count = 1});  // the larger region; the old size again is given
  EXPECT_THROW(arena.set_budget(device_budget(8_MiB)), out_of_memory);
  dev.heal(device_call::allocate);
  EXPECT_EQ(arena.capacity(), 4_MiB) << "a refused set_budget should leave the old region";
  owned_stream s(dev);
  void* p = arena.allocate(4_MiB, s);
  arena.deallocate(p, 4_MiB, s);
  arena.forget_stream(s);
}

// The system refuses to pin a whole region: the pool pins just the request instead.
TEST(PinnedPoolDeviceFaults, ARefusedRegionIsRetriedAtTheRequestsSize) {
  faulty_device dev(std::make_unique<cpu_device>());
  pinned_pool_options o;
  o.region_size = 4_MiB;
  pinned_host_pool pool(dev, o);
  dev.fail(device_call::allocate_pinned, {.min_bytes = 4_MiB});
  void* p = pool.allocate(64_KiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(dev.failures(device_call::allocate_pinned), 1u);
  auto st = pool.stats();
  EXPECT_EQ(st.regions, 1u);
  EXPECT_EQ(st.reserved_bytes, 64_KiB) << "the retry should pin the request's size";
  pool.check_invariants();
  pool.deallocate(p, 64_KiB);
}

// The system refuses every pin: a clear out_of_memory that says so and names the size; nothing
// is left half made, and the pool works once the system gives memory again.
TEST(PinnedPoolDeviceFaults, ARefusalOfEveryPinIsAClearErrorAndChangesNothing) {
  faulty_device dev(std::make_unique<cpu_device>());
  pinned_pool_options o;
  o.region_size = 4_MiB;
  pinned_host_pool pool(dev, o);
  void* kept = pool.allocate(3_MiB);  // fills most of the first region
  dev.fail(device_call::allocate_pinned);
  try {
    (void)pool.allocate(2_MiB);
    ADD_FAILURE() << "expected out_of_memory";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("refused to pin more"), std::string::npos) << what;
    EXPECT_NE(what.find("2.00 MiB"), std::string::npos) << what;
  }
  EXPECT_EQ(dev.failures(device_call::allocate_pinned), 2u) << "a region of the pool's size, then one of the request's";
  auto st = pool.stats();
  EXPECT_EQ(st.regions, 1u);
  EXPECT_EQ(st.allocated_bytes, 3_MiB);
  pool.check_invariants();
  dev.heal(device_call::allocate_pinned);
  void* more = pool.allocate(2_MiB);
  ASSERT_NE(more, nullptr);
  pool.deallocate(more, 2_MiB);
  pool.deallocate(kept, 3_MiB);
  pool.check_invariants();
}

// Pinning is slow on a GPU (cudaHostRegister walks every page), and the pool's frees come from
// other threads (the NVMe ring's, the event worker's) as copies complete: a region being pinned
// holds none of them up (Note [Pinning outside the lock]), and the capacity counts it meanwhile.
TEST(PinnedHostPoolFaults, PinningARegionHoldsUpNoFreeOnAnotherThread) {
  faulty_device dev(std::make_unique<cpu_device>());
  pinned_host_pool pool(dev, {.capacity = 3_MiB, .region_size = 1_MiB});
  void* a = pool.allocate(256_KiB);  // the first region (1 MiB), kept in use throughout
  void* c = pool.allocate(256_KiB);
  std::atomic<bool> pinning{false}, go_on{false};
  dev.before_pinning = [&] {
    pinning = true;
    while (!go_on) std::this_thread::yield();
  };
  // No free block fits 900 KiB: a region of its own size is pinned, held up here.
  std::thread grow([&] { pool.deallocate(pool.allocate(900_KiB), 900_KiB); });
  while (!pinning) std::this_thread::yield();
  std::atomic<bool> freed{false};
  std::thread release([&] {
    pool.deallocate(c, 256_KiB);
    freed = true;
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!freed && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  if (!freed) {  // let the pinning end, so that the test fails instead of hanging
    go_on = true;
    grow.join();
    release.join();
    FAIL() << "a free waited for another thread's pinning";
  }
  // The region being pinned counts against the capacity: 1024 KiB pinned and 900 KiB pinning
  // leave 1148 KiB of the 3 MiB, so 1152 KiB is refused at once.
  EXPECT_THROW((void)pool.allocate(1_MiB + 128_KiB), out_of_memory);
  go_on = true;
  grow.join();
  release.join();
  pool.deallocate(a, 256_KiB);
  pool.check_invariants();
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().regions, 2u);
}

// A pin refused for another reason than memory (a cuda_error: the call is not supported, an
// argument is invalid) gives the bytes it held against the capacity back: the next request
// that fits is served.
TEST(PinnedHostPoolFaults, APinThatFailsOtherwiseGivesItsBytesBackToTheCapacity) {
  faulty_device dev(std::make_unique<cpu_device>());
  pinned_host_pool pool(dev, {.capacity = 2_MiB, .region_size = 1_MiB});
  int refusals = 1;
  dev.before_pinning = [&] {
    if (refusals-- > 0) throw cuda_error("pinning refused for the test");
  };
  EXPECT_THROW((void)pool.allocate(64_KiB), cuda_error);
  void* whole = nullptr;
  ASSERT_NO_THROW(whole = pool.allocate(2_MiB)) << "the refused pin still holds capacity";
  pool.deallocate(whole, 2_MiB);
  pool.check_invariants();
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}


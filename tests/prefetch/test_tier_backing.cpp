// tier_backing's retired copies (Note [Retired copies]): saving or releasing a tensor whose
// load is still in flight neither waits for that load nor lets it read freed or reused bytes;
// only a host tier out of room makes a save wait for the old copy. Moves use no host function:
// a save then a load are ordered by device events, and an NVMe round trip is pipelined.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "../swap/swap_test_support.hpp"
#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/tier_backing.hpp"
#include "swap/host_tier.hpp"
#include "swap/nvme_tier.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

constexpr std::size_t kBytes = 64_KiB;

struct fixture {
  explicit fixture(std::size_t host_capacity)
      : pool(dev, {.capacity = 0, .region_size = 8_MiB, .alignment = 4096}),
        host(pool, host_capacity),
        backing(dev, host, nullptr),
        slow(dev),
        fast(dev) {
    dev.set_stream_delay(slow.get(), std::chrono::milliseconds(150));  // a load that lands late
  }
  // Device memory holding `v`.
  void* on_device(const std::vector<char>& v) {
    void* d = dev.allocate(kBytes);
    dev.copy_async(d, v.data(), kBytes, copy_kind::host_to_device, fast.get());
    dev.synchronize_stream(fast.get());
    return d;
  }
  // The tier holds `old_value`; a slow load of it is in flight into `loaded` when the tensor is
  // saved again from `newer`.
  void load_then_save(const std::vector<char>& old_value, void* loaded, void* newer, move_handle& load) {
    backing.put(0, "x", old_value.data(), kBytes, tier::host);
    load = backing.load(0, "x", loaded, kBytes, slow.get());
    (void)backing.save(0, "x", newer, kBytes, tier::host, fast.get());
  }
  std::vector<char> tier_value() {
    std::vector<char> got(kBytes);
    backing.get(0, "x", got.data(), kBytes);
    return got;
  }
  std::vector<char> device_value(void* d) {
    std::vector<char> out(kBytes);
    dev.copy_async(out.data(), d, kBytes, copy_kind::device_to_host, fast.get());
    dev.synchronize_stream(fast.get());
    return out;
  }
  cpu_device dev;
  pinned_host_pool pool;
  host_tier host;
  tier_backing backing;
  owned_stream slow, fast;
};

}  // namespace

TEST(TierBacking, ReleasingATensorDoesNotWaitForItsLoad) {
  fixture f(1_MiB);
  std::vector<char> a(kBytes, 'a');
  f.backing.put(0, "x", a.data(), kBytes, tier::host);
  void* d = f.dev.allocate(kBytes);
  move_handle load = f.backing.load(0, "x", d, kBytes, f.slow.get());
  f.backing.discard(0);
  EXPECT_FALSE(load.ready()) << "discard waited for the load in flight";
  EXPECT_GT(f.host.stats().used_bytes, 0u) << "the copy the load reads was freed under it";
  f.backing.drain();
  EXPECT_TRUE(load.ready());
  EXPECT_EQ(f.host.stats().used_bytes, 0u) << "the retired copy outlived its load";
  EXPECT_EQ(f.device_value(d), a);
  f.dev.deallocate(d, kBytes);
}

// The tier holds 'a'; a slow load of it is in flight when the tensor is saved again with 'b'.
// Returns whether the load had landed by the time the save returned. Either way the load must
// read 'a' and the tier must then hold 'b'.
static bool save_over_a_load(fixture& f) {
  std::vector<char> a(kBytes, 'a'), b(kBytes, 'b');
  void* loaded = f.dev.allocate(kBytes);
  void* newer = f.on_device(b);
  move_handle load;
  f.load_then_save(a, loaded, newer, load);
  const bool landed = load.ready();
  f.backing.drain();
  EXPECT_EQ(f.device_value(loaded), a) << "the load read the new value, or freed bytes";
  EXPECT_EQ(f.tier_value(), b);
  f.dev.deallocate(loaded, kBytes);
  f.dev.deallocate(newer, kBytes);
  return landed;
}

TEST(TierBacking, SavingOverALoadInFlightKeepsBothValues) {
  fixture f(1_MiB);
  EXPECT_FALSE(save_over_a_load(f)) << "save waited for the load in flight";
  EXPECT_EQ(f.host.stats().blocks, 1u) << "the retired copy outlived its load";
}

TEST(TierBacking, ASaveWaitsForTheOldCopyOnlyWhenTheHostTierIsFull) {
  fixture f(kBytes);  // room for one copy
  EXPECT_TRUE(save_over_a_load(f)) << "with no room for a second copy, the save must wait for the first";
}

// The moves carry device events and use no host function (Note [Moves without host functions]):
// host functions of every stream share one callback thread and must never wait, so a save to the
// host tier followed at once by a load of the same tensor is ordered on the device.
TEST(TierBacking, ASaveToTheHostTierThenALoadAtOnceUseNoHostFunction) {
  fixture f(1_MiB);
  std::vector<char> a(kBytes, 'a');
  void* src = f.on_device(a);
  void* dst = f.dev.allocate(kBytes);
  owned_stream h2d(f.dev);
  const auto before = f.dev.counters();
  // The save lands late (the slow stream); the load must still read what it wrote.
  move_handle save = f.backing.save(0, "x", src, kBytes, tier::host, f.slow.get());
  EXPECT_TRUE(save.has_device_event());
  save.stream_wait(f.dev, h2d.get());  // a device-side wait: returns at once
  EXPECT_FALSE(save.ready()) << "stream_wait waited on the host for a save with a device event";
  move_handle load = f.backing.load(0, "x", dst, kBytes, h2d.get());
  owned_stream consumer(f.dev);
  load.stream_wait(f.dev, consumer.get());
  std::vector<char> out(kBytes);
  f.dev.copy_async(out.data(), dst, kBytes, copy_kind::device_to_host, consumer.get());  // pageable: synchronous
  EXPECT_EQ(out, a);
  EXPECT_TRUE(load.ready());
  f.backing.drain();
  EXPECT_TRUE(save.ready());
  EXPECT_EQ(f.dev.counters().host_functions, before.host_functions) << "a move used a host function";
  f.dev.synchronize();  // no strict rule was broken (a broken one is a sticky error)
  f.dev.deallocate(src, kBytes);
  f.dev.deallocate(dst, kBytes);
}

namespace {
// A tier backing with an NVMe tier, on a device whose link is slow (1 MiB takes ~20 ms).
struct nvme_fixture {
  nvme_fixture()
      : dev(slow_link()),
        pool(dev, {.capacity = 0, .region_size = 16_MiB, .alignment = 4096}),
        host(pool, 8_MiB),
        nvme(nvme_opts(dir.path(), plan), &pool),
        backing(dev, host, &nvme) {}
  static device_options slow_link() {
    device_options o;
    o.cpu_device_memory = 64_MiB;
    o.h2d_bytes_per_second = 50e6;
    o.d2h_bytes_per_second = 50e6;
    return o;
  }
  static nvme_options nvme_opts(const std::string& d, std::shared_ptr<test::fault_plan> p) {
    nvme_options o;
    o.directories = {d};
    o.capacity = 32_MiB;
    o.make_queue = test::faulty(std::move(p));
    return o;
  }
  test::temp_dir dir;
  std::shared_ptr<test::fault_plan> plan = std::make_shared<test::fault_plan>();
  cpu_device dev;
  pinned_host_pool pool;
  host_tier host;
  nvme_tier nvme;
  tier_backing backing;
};
}  // namespace

TEST(TierBacking, AnNvmeRoundTripUnderASlowLinkUsesNoHostFunction) {
  nvme_fixture f;
  constexpr std::size_t n = 1_MiB + 4096 + 7;  // not a whole number of blocks
  const auto data = test::random_bytes(n, 11);
  owned_stream d2h(f.dev), h2d(f.dev), compute(f.dev);
  void* src = f.dev.allocate(n);
  f.dev.copy_async(src, data.data(), n, copy_kind::host_to_device, compute.get());
  f.dev.synchronize_stream(compute.get());
  const auto before = f.dev.counters();

  move_handle save = f.backing.save(0, "w", src, n, tier::nvme, d2h.get());
  EXPECT_FALSE(save.has_device_event()) << "a save that ends in file I/O has no device event";
  EXPECT_FALSE(save.ready()) << "save waited for its D2H copy (or its write) before returning";
  EXPECT_EQ(f.backing.where(0), tier::nvme);
  // The load needs the write done: it waits on the host, then starts the read and returns.
  void* dst = f.dev.allocate(n);
  f.dev.memset_async(dst, 0, n, h2d.get());
  move_handle load = f.backing.load(0, "w", dst, n, h2d.get());
  EXPECT_TRUE(save.ready());
  EXPECT_TRUE(f.nvme.contains("w#0.1"));
  // The consumer waits on the event recorded after the H2D copy, which the read's completion
  // enqueued; stream_wait waits on this thread until that event is recorded.
  load.stream_wait(f.dev, compute.get());
  std::vector<unsigned char> out(n);
  f.dev.copy_async(out.data(), dst, n, copy_kind::device_to_host, compute.get());
  EXPECT_EQ(out, data) << "the consumer ran before the H2D copy of the NVMe load";
  load.wait();
  f.backing.drain();
  EXPECT_EQ(f.dev.counters().host_functions, before.host_functions) << "a move used a host function";
  EXPECT_EQ(f.host.stats().used_bytes, 0u) << "a staging block was not freed";
  const auto c = f.backing.counters();
  EXPECT_EQ(c.nvme_write_bytes, n);
  EXPECT_EQ(c.nvme_read_bytes, n);
  f.dev.synchronize();  // no strict rule was broken
  f.backing.discard(0);
  f.dev.deallocate(src, n);
  f.dev.deallocate(dst, n);
}

TEST(TierBacking, ACorruptNvmeCopyFailsTheLoadAndCopiesNothing) {
  nvme_fixture f;
  constexpr std::size_t n = 256_KiB;
  std::vector<unsigned char> data(n, 7);
  f.plan->kind = io_kind::write;
  f.plan->what = test::fault_plan::action::corrupt_on_disk;
  f.backing.put(0, "c", data.data(), n, tier::nvme);
  f.plan->disarm();
  ASSERT_EQ(f.backing.where(0), tier::nvme);
  owned_stream h2d(f.dev), compute(f.dev);
  void* dst = f.dev.allocate(n);
  f.dev.memset_async(dst, 1, n, h2d.get());
  const auto before = f.dev.counters();
  move_handle load = f.backing.load(0, "c", dst, n, h2d.get());
  EXPECT_THROW(load.wait_enqueued(), corruption_error);
  load.stream_wait(f.dev, compute.get());  // nothing to wait for: no copy was enqueued
  f.dev.synchronize();
  std::vector<unsigned char> out(n);
  f.dev.copy_async(out.data(), dst, n, copy_kind::device_to_host, compute.get());
  EXPECT_EQ(out, std::vector<unsigned char>(n, 1)) << "a failed read reached the device";
  f.backing.drain();
  EXPECT_EQ(f.host.stats().used_bytes, 0u) << "the staging block of the failed read leaked";
  EXPECT_EQ(f.dev.counters().host_functions, before.host_functions);
  f.dev.deallocate(dst, n);
}

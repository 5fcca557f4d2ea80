// tier_backing's retired copies (Note [Retired copies]): saving or releasing a tensor whose
// load is still in flight neither waits for that load nor lets it read freed or reused bytes;
// only a host tier out of room makes a save wait for the old copy.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/units.hpp"
#include "prefetch/tier_backing.hpp"
#include "swap/host_tier.hpp"

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

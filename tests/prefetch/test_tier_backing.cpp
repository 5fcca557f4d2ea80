// tier_backing's retired copies (Note [Retired copies]): saving or releasing a tensor whose
// load is still in flight neither waits for that load nor lets it read freed or reused bytes;
// only a host tier out of room makes a save wait for the old copy. Moves use no host function:
// a save then a load are ordered by device events, and an NVMe round trip is pipelined.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../swap/swap_test_support.hpp"
#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "prefetch/tier_backing.hpp"
#include "swap/host_tier.hpp"
#include "swap/nvme_tier.hpp"
#include "../test_seed.hpp"

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
    o.reserve = 32_MiB;
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

// ---- every path, failures and misuse (ported from swap/tensor_store's tests) ----------------
// Device <-> host tier and device <-> NVMe tier round trips of many sizes, put/get on both
// tiers, a failed NVMe write that keeps the bytes on the host, a corrupt NVMe copy that is
// reported and stays, a full host tier, and a random sequence of moves against a reference model.

namespace {

// The message names the tensor: "tensor" as the backing writes it, or 'tensor#id.generation'
// as the NVMe tier writes the name of the backing's copy.
bool names(const std::exception& e, const std::string& tensor) {
  const std::string what = e.what();
  return what.find('"' + tensor + '"') != std::string::npos || what.find("'" + tensor + "#") != std::string::npos;
}

device_options device_with(std::size_t memory) {
  device_options o;
  o.cpu_device_memory = memory;
  return o;
}

// A tier backing over a host tier of `host_capacity` and (unless `with_nvme` is false) an NVMe
// tier whose I/O goes through a fault plan, on a device with no link limit.
struct tiers_fixture {
  explicit tiers_fixture(std::size_t host_capacity = 256_MiB, bool with_nvme = true)
      : dev(device_with(256_MiB)),
        pool(dev, {.capacity = 0, .region_size = 64_MiB, .alignment = 4096}),
        host(pool, host_capacity),
        nvme(nvme_opts(dir.path(), plan), &pool),
        backing(dev, host, with_nvme ? &nvme : nullptr) {}
  static nvme_options nvme_opts(const std::string& d, std::shared_ptr<test::fault_plan> p) {
    nvme_options o;
    o.directories = {d};
    o.reserve = 192_MiB;
    o.make_queue = test::faulty(std::move(p));
    return o;
  }
  // Device memory holding `data` (at least one byte).
  void* on_device(const std::vector<unsigned char>& data) {
    void* d = dev.allocate(std::max<std::size_t>(data.size(), 1));
    dev.copy_async(d, data.data(), data.size(), copy_kind::host_to_device, s.get());
    dev.synchronize_stream(s.get());
    return d;
  }
  std::vector<unsigned char> read_device(const void* d, std::size_t n) {
    std::vector<unsigned char> out(n);
    dev.copy_async(out.data(), d, n, copy_kind::device_to_host, s.get());
    dev.synchronize_stream(s.get());
    return out;
  }
  // Loads tensor `id` into `dst` (cleared first) and returns what landed there.
  std::vector<unsigned char> load(tensor_id id, const std::string& name, void* dst, std::size_t n) {
    dev.memset_async(dst, 0, n, s.get());
    backing.load(id, name, dst, n, s.get()).wait();
    return read_device(dst, n);
  }
  std::vector<unsigned char> get(tensor_id id, const std::string& name, std::size_t n) {
    std::vector<unsigned char> out(n);
    backing.get(id, name, out.data(), n);
    return out;
  }
  // Nothing left behind: no host-tier block, no staging block, no NVMe extent.
  void expect_empty() {
    EXPECT_EQ(host.stats().used_bytes, 0u) << "a host-tier block leaked";
    EXPECT_EQ(pool.stats().allocated_bytes, 0u) << "a staging block leaked";
    EXPECT_EQ(nvme.stats().stored_bytes, 0u) << "an NVMe copy leaked";
  }
  test::temp_dir dir;
  std::shared_ptr<test::fault_plan> plan = std::make_shared<test::fault_plan>();
  cpu_device dev;
  pinned_host_pool pool;
  host_tier host;
  nvme_tier nvme;
  tier_backing backing;
  owned_stream s{dev};
};

}  // namespace

TEST(TierBacking, EveryPathRoundTripsManySizes) {
  tiers_fixture f;
  std::uint64_t seed = 1;
  tensor_id id = 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{1_MiB + 1}, std::size_t{3_MiB + 333},
                        std::size_t{64_MiB}}) {
    const auto data = test::random_bytes(n, seed++);
    const std::string name = "t" + std::to_string(n);
    void* src = f.on_device(data);
    void* dst = f.dev.allocate(n);
    // device -> host tier -> device
    f.backing.save(id, name, src, n, tier::host, f.s.get()).wait();
    EXPECT_EQ(f.backing.where(id), tier::host);
    ASSERT_EQ(f.get(id, name, n), data) << "device->host " << n;
    ASSERT_EQ(f.load(id, name, dst, n), data) << "host->device " << n;
    // device -> NVMe tier -> device, through staging; the host copy is superseded
    f.backing.save(id, name, src, n, tier::nvme, f.s.get()).wait();
    EXPECT_EQ(f.backing.where(id), tier::nvme);
    EXPECT_EQ(f.nvme.stats().stored_bytes > 0, true);
    ASSERT_EQ(f.load(id, name, dst, n), data) << "nvme->device " << n;
    ASSERT_EQ(f.get(id, name, n), data) << "nvme->host (get) " << n;
    // host bytes put straight on each tier
    const auto other = test::random_bytes(n, seed + 100);
    f.backing.put(id, name, other.data(), n, tier::nvme);
    EXPECT_EQ(f.backing.where(id), tier::nvme);
    ASSERT_EQ(f.load(id, name, dst, n), other) << "put nvme " << n;
    f.backing.put(id, name, data.data(), n, tier::host);
    EXPECT_EQ(f.backing.where(id), tier::host);
    ASSERT_EQ(f.load(id, name, dst, n), data) << "put host " << n;
    f.backing.discard(id);
    EXPECT_EQ(f.backing.where(id), std::nullopt);
    f.dev.deallocate(src, n);
    f.dev.deallocate(dst, n);
    ++id;
  }
  f.backing.drain();
  f.expect_empty();
}

TEST(TierBacking, ALoadKeepsTheTierCopy) {
  tiers_fixture f;
  constexpr std::size_t n = 1_MiB + 5;
  const auto data = test::random_bytes(n, 21);
  void* src = f.on_device(data);
  void* dst = f.dev.allocate(n);
  for (tier t : {tier::host, tier::nvme}) {
    f.backing.save(0, "k", src, n, t, f.s.get()).wait();
    ASSERT_EQ(f.load(0, "k", dst, n), data) << to_string(t);
    EXPECT_EQ(f.backing.where(0), t) << "the load released the tier copy";
    ASSERT_EQ(f.load(0, "k", dst, n), data) << "second load from " << to_string(t);
  }
  f.backing.discard(0);
  f.backing.drain();
  f.expect_empty();
  f.dev.deallocate(src, n);
  f.dev.deallocate(dst, n);
}

// A save that ends in file I/O has no device event: stream_wait waits on the caller's thread
// for it, and no host function is left on the stream to wait (they share one callback thread).
TEST(TierBacking, StreamWaitOnASaveToNvmeWaitsOnTheCallersThread) {
  tiers_fixture f;
  const auto data = test::random_bytes(6_MiB + 7, 3);
  void* src = f.on_device(data);
  owned_stream compute(f.dev);
  const auto before = f.dev.counters().host_functions;
  auto save = f.backing.save(0, "w", src, data.size(), tier::nvme, f.s.get());
  EXPECT_FALSE(save.has_device_event());
  EXPECT_EQ(save.device_event().handle, nullptr);
  save.stream_wait(f.dev, compute.get());
  EXPECT_TRUE(save.ready());
  EXPECT_GT(f.nvme.stats().stored_bytes, 0u);
  f.dev.synchronize_stream(compute.get());
  EXPECT_EQ(f.dev.counters().host_functions, before);
  f.backing.discard(0);
  f.backing.drain();
  f.expect_empty();
  f.dev.deallocate(src, data.size());
}

TEST(TierBacking, AFailedWriteToNvmeKeepsTheBytesOnTheHostReadable) {
  tiers_fixture f;
  const auto data = test::random_bytes(3_MiB, 4);
  void* src = f.on_device(data);
  void* dst = f.dev.allocate(data.size());
  f.plan->kind = io_kind::write;
  f.plan->what = test::fault_plan::action::fail;
  f.plan->error = ENOSPC;
  f.plan->first = 2;
  try {
    f.backing.save(0, "h", src, data.size(), tier::nvme, f.s.get()).wait();
    FAIL() << "no error";
  } catch (const io_error& e) {
    EXPECT_TRUE(names(e, "h")) << e.what();
  }
  f.plan->disarm();
  EXPECT_EQ(f.backing.where(0), tier::host) << "the bytes were lost with the write";
  EXPECT_EQ(f.get(0, "h", data.size()), data);
  EXPECT_EQ(f.load(0, "h", dst, data.size()), data);
  EXPECT_EQ(f.nvme.stats().stored_bytes, 0u) << "the failed write kept its extents";
  f.backing.save(0, "h", src, data.size(), tier::nvme, f.s.get()).wait();  // works again once the drive does
  EXPECT_EQ(f.backing.where(0), tier::nvme);
  EXPECT_EQ(f.load(0, "h", dst, data.size()), data);
  f.backing.discard(0);
  f.backing.drain();
  f.expect_empty();
  f.dev.deallocate(src, data.size());
  f.dev.deallocate(dst, data.size());
}

TEST(TierBacking, ACorruptNvmeCopyIsReportedByGetAndStaysOnNvme) {
  tiers_fixture f;
  const auto data = test::random_bytes(2_MiB, 6);
  f.plan->kind = io_kind::write;
  f.plan->what = test::fault_plan::action::corrupt_on_disk;
  f.plan->first = 1;
  f.backing.put(0, "c", data.data(), data.size(), tier::nvme);
  f.plan->disarm();
  std::vector<unsigned char> out(data.size());
  try {
    f.backing.get(0, "c", out.data(), data.size());
    FAIL() << "corruption not reported";
  } catch (const corruption_error& e) {
    EXPECT_TRUE(names(e, "c")) << e.what();
  }
  EXPECT_EQ(f.backing.where(0), tier::nvme);
  EXPECT_THROW(f.backing.get(0, "c", out.data(), data.size()), corruption_error) << "a second read got past it";
  EXPECT_EQ(f.pool.stats().allocated_bytes, 0u) << "the staging block of the failed read leaked";
  f.backing.discard(0);
  f.backing.drain();
  f.expect_empty();
}

TEST(TierBacking, AFullHostTierSpillsToNvmeOrIsOutOfMemoryNamingTheTensor) {
  const auto data = test::random_bytes(2_MiB, 8);
  {
    tiers_fixture f(1_MiB);
    void* src = f.on_device(data);
    void* dst = f.dev.allocate(data.size());
    f.backing.save(0, "big", src, data.size(), tier::host, f.s.get()).wait();
    EXPECT_EQ(f.backing.where(0), tier::nvme) << "no room on the host tier: the NVMe tier takes it";
    EXPECT_EQ(f.load(0, "big", dst, data.size()), data);
    f.backing.discard(0);
    f.backing.drain();
    f.expect_empty();
    f.dev.deallocate(src, data.size());
    f.dev.deallocate(dst, data.size());
  }
  tiers_fixture f(1_MiB, false);
  void* src = f.on_device(data);
  try {
    (void)f.backing.save(0, "big", src, data.size(), tier::host, f.s.get());
    FAIL() << "no error";
  } catch (const out_of_memory& e) {
    EXPECT_TRUE(names(e, "big")) << e.what();
  }
  EXPECT_EQ(f.backing.where(0), std::nullopt);
  EXPECT_THROW(f.backing.put(0, "big", data.data(), data.size(), tier::nvme), out_of_memory) << "no NVMe tier to fall back on";
  f.backing.drain();
  f.expect_empty();
  f.dev.deallocate(src, data.size());
}

TEST(TierBacking, MisuseIsAClearError) {
  tiers_fixture f;
  void* dst = f.dev.allocate(100);
  EXPECT_THROW((void)f.backing.load(0, "none", dst, 100, f.s.get()), error);
  std::vector<unsigned char> out(100);
  EXPECT_THROW(f.backing.get(0, "none", out.data(), 100), error);
  std::vector<unsigned char> v(100, 3);
  f.backing.put(0, "x", v.data(), 100, tier::host);
  try {
    (void)f.backing.load(0, "x", dst, 50, f.s.get());
    FAIL() << "a load of the wrong size was accepted";
  } catch (const error& e) {
    EXPECT_TRUE(names(e, "x")) << e.what();
  }
  EXPECT_EQ(f.get(0, "x", 100), v) << "a refused load changed the copy";
  f.backing.discard(0);
  f.backing.drain();
  f.expect_empty();
  f.dev.deallocate(dst, 100);
}

// A put with no bytes stores zeros, also when its block (a host-tier block, or the staging block
// of an NVMe write) held another tensor's bytes a moment before.
TEST(TierBacking, APutWithNoBytesReadsBackZerosInAReusedBlock) {
  tiers_fixture f;
  constexpr std::size_t n = 1_MiB + 5;
  const std::vector<unsigned char> filled(n, 0xAB);
  for (tier t : {tier::host, tier::nvme}) {
    SCOPED_TRACE(to_string(t));
    f.backing.put(0, "a", filled.data(), n, t);
    ASSERT_EQ(f.get(0, "a", n), filled);
    f.backing.discard(0);
    f.backing.drain();
    f.backing.put(1, "b", nullptr, n, t);
    EXPECT_EQ(f.backing.where(1), t);
    const auto got = f.get(1, "b", n);
    EXPECT_EQ(static_cast<std::size_t>(std::count(got.begin(), got.end(), 0)), n)
        << "the new tensor holds the old one's bytes";
    f.backing.discard(1);
    f.backing.drain();
  }
  f.expect_empty();
}

// A random sequence of saves, loads, puts, gets and discards over a few tensors of random sizes,
// on both tiers, checked after every step against a reference model (id -> bytes and tier).
TEST(TierBacking, RandomMovesMatchAReferenceModel) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    tiers_fixture f(2_MiB);  // small enough that some host saves fall back to NVMe
    std::mt19937_64 rng(spillway::test::test_seed(seed));
    constexpr tensor_id kTensors = 6;
    constexpr std::size_t kMax = 512_KiB;
    struct model_copy {
      std::vector<unsigned char> bytes;
      tier where;
    };
    std::map<tensor_id, model_copy> model;
    std::vector<void*> dev_buf(kTensors);
    for (auto& d : dev_buf) d = f.dev.allocate(kMax);
    void* dst = f.dev.allocate(kMax);
    auto pick_size = [&] { return std::size_t{1} + rng() % kMax; };
    auto pick_tier = [&] { return rng() % 2 == 0 ? tier::host : tier::nvme; };
    for (int step = 0; step < 200; ++step) {
      const auto id = static_cast<tensor_id>(rng() % kTensors);
      const std::string name = "r" + std::to_string(id);
      const int op = static_cast<int>(rng() % 5);
      SCOPED_TRACE("step " + std::to_string(step) + " op " + std::to_string(op) + " tensor " + name);
      if (op == 0) {  // save fresh device bytes
        auto data = test::random_bytes(pick_size(), rng());
        f.dev.copy_async(dev_buf[id], data.data(), data.size(), copy_kind::host_to_device, f.s.get());
        const tier want = pick_tier();
        auto h = f.backing.save(id, name, dev_buf[id], data.size(), want, f.s.get());
        if (rng() % 2 == 0) h.wait();  // else left in flight for later steps to order after
        const auto got = f.backing.where(id);
        ASSERT_TRUE(got.has_value());
        if (want == tier::nvme) {
          ASSERT_EQ(*got, tier::nvme);
        }
        model[id] = model_copy{std::move(data), *got};
      } else if (op == 1) {  // put host bytes
        auto data = test::random_bytes(pick_size(), rng());
        const tier want = pick_tier();
        f.backing.put(id, name, data.data(), data.size(), want);
        const auto got = f.backing.where(id);
        ASSERT_TRUE(got.has_value());
        if (want == tier::nvme) {
          ASSERT_EQ(*got, tier::nvme);
        }
        model[id] = model_copy{std::move(data), *got};
      } else if (op == 2 && model.contains(id)) {  // load
        const auto& m = model.at(id);
        ASSERT_EQ(f.load(id, name, dst, m.bytes.size()), m.bytes);
      } else if (op == 3 && model.contains(id)) {  // get
        const auto& m = model.at(id);
        ASSERT_EQ(f.get(id, name, m.bytes.size()), m.bytes);
      } else if (op == 4) {  // discard
        f.backing.discard(id);
        model.erase(id);
      }
      for (tensor_id k = 0; k < kTensors; ++k) {
        const auto it = model.find(k);
        const auto got = f.backing.where(k);
        if (it == model.end()) {
          ASSERT_EQ(got, std::nullopt) << "tensor " << k;
        } else {
          ASSERT_EQ(got, it->second.where) << "tensor " << k;
        }
      }
    }
    f.backing.drain();
    for (const auto& [k, m] : model) {
      ASSERT_EQ(f.get(k, "r" + std::to_string(k), m.bytes.size()), m.bytes) << "tensor " << k << " at the end";
      f.backing.discard(k);
    }
    f.backing.drain();
    f.expect_empty();
    for (auto* d : dev_buf) f.dev.deallocate(d, kMax);
    f.dev.deallocate(dst, kMax);
  }
}

// Many tensors moving both ways at once, from several threads on several streams, through an
// NVMe tier striped over two directories with several rings; every byte compared at the end.
TEST(TierBackingConcurrency, ManyTensorsMovingBothWaysOnSeveralStreams) {
  test::temp_dir a, b;
  cpu_device dev(device_with(256_MiB));
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 32_MiB, .alignment = 4096});
  host_tier host(pool, 128_MiB);
  nvme_options o;
  o.directories = {a.path(), b.path()};
  o.reserve = 256_MiB;
  o.block_size = 256_KiB;
  o.queue_depth = 16;
  o.rings = 2;
  nvme_tier nvme(o, &pool);
  tier_backing backing(dev, host, &nvme);

  constexpr int threads = 4;
  constexpr int per_thread = 6;
  constexpr int rounds = 3;
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      owned_stream s(dev);
      std::vector<std::string> tensor_names;
      std::vector<std::vector<unsigned char>> data;
      std::vector<void*> dptr;
      for (int i = 0; i < per_thread; ++i) {
        tensor_names.push_back("t" + std::to_string(t) + "_" + std::to_string(i));
        data.push_back(test::random_bytes(1 + (static_cast<std::size_t>(t * 7 + i * 13) % 5) * 700_KiB + i * 37, t * 100 + i));
        dptr.push_back(dev.allocate(data.back().size()));
        dev.copy_async(dptr.back(), data.back().data(), data.back().size(), copy_kind::host_to_device, s.get());
      }
      dev.synchronize_stream(s.get());
      auto id = [&](int i) { return static_cast<tensor_id>(t * per_thread + i); };
      for (int r = 0; r < rounds; ++r) {
        std::vector<move_handle> out;
        for (int i = 0; i < per_thread; ++i)
          out.push_back(backing.save(id(i), tensor_names[i], dptr[i], data[i].size(), (i + r) % 2 == 0 ? tier::nvme : tier::host,
                                     s.get()));
        for (auto& h : out) h.wait();
        for (int i = 0; i < per_thread; ++i) dev.memset_async(dptr[i], 0, data[i].size(), s.get());
        std::vector<move_handle> in;
        for (int i = 0; i < per_thread; ++i) in.push_back(backing.load(id(i), tensor_names[i], dptr[i], data[i].size(), s.get()));
        for (auto& h : in) h.wait();
        for (int i = 0; i < per_thread; ++i) {
          std::vector<unsigned char> back(data[i].size());
          dev.copy_async(back.data(), dptr[i], back.size(), copy_kind::device_to_host, s.get());
          dev.synchronize_stream(s.get());
          if (back != data[i]) failures.fetch_add(1);
        }
      }
      for (int i = 0; i < per_thread; ++i) {
        backing.discard(id(i));
        dev.deallocate(dptr[i], data[i].size());
      }
    });
  }
  for (auto& w : workers) w.join();
  backing.drain();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(host.stats().used_bytes, 0u);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(nvme.stats().stored_bytes, 0u);
  EXPECT_EQ(nvme.stats().failed_moves, 0u);
  const auto c = backing.counters();
  EXPECT_GT(c.nvme_write_bytes, 0u);
  EXPECT_EQ(c.d2h_bytes, c.h2d_bytes) << "every save was loaded back once";
}

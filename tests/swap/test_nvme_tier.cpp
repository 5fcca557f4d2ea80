// NVMe tier on io_uring: round trips of many sizes through aligned pinned buffers (fixed
// buffers, no bounce) and through unaligned ones (bounce), striping over directories, space
// accounting, clear errors for a full tier and misuse, buffered fallback, /dev/shm.
#include <gtest/gtest.h>
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/huge_pages.hpp"
#include "device/log.hpp"
#include "device/units.hpp"
#include "swap/nvme_tier.hpp"
#include "swap/thread_queue.hpp"
#include "swap_test_support.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

// Built twice: as is, on io_uring, and with SPILLWAY_TEST_THREAD_QUEUE, on the pread/pwrite
// threads the tier falls back to where io_uring is refused (the same tests, bar the ones about
// io_uring's own fixed buffers, which make their queue themselves).
#ifdef SPILLWAY_TEST_THREAD_QUEUE
constexpr bool on_threads = true;
#else
constexpr bool on_threads = false;
#endif

nvme_options options_for(std::vector<std::string> dirs, std::uint64_t capacity) {
  nvme_options o;
  if (on_threads) o.make_queue = make_thread_queue;
  o.directories = std::move(dirs);
  o.reserve = capacity;
  return o;
}

// Sizes from 1 byte to 64 MiB: edges around the alignment and the block size, and random ones.
std::vector<std::size_t> sizes() {
  std::vector<std::size_t> v{1, 511, 512, 4095, 4096, 4097, 1_MiB - 1, 1_MiB, 1_MiB + 1, 3_MiB + 123, 64_MiB};
  std::mt19937_64 rng(spillway::test::test_seed(2024));
  for (int i = 0; i < 6; ++i) v.push_back(1 + rng() % (9_MiB));
  return v;
}

}  // namespace

TEST(NvmeTier, RoundTripsFromPinnedBuffersUseFixedBuffersAndNoBounce) {
  test::temp_dir dir;
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 32_MiB, .alignment = 4096});
  nvme_tier tier(options_for({dir.path()}, 160_MiB), &pool);
  EXPECT_TRUE(tier.direct_io());
  std::uint64_t seed = 1;
  for (std::size_t n : sizes()) {
    const auto data = test::random_bytes(n, seed++);
    auto* src = static_cast<unsigned char*>(pool.allocate(n));
    auto* dst = static_cast<unsigned char*>(pool.allocate(n));
    std::memcpy(src, data.data(), n);
    const std::string name = "t" + std::to_string(n);
    tier.write(name, src, n, n + (4096 - n % 4096) % 4096).wait();
    EXPECT_TRUE(tier.contains(name));
    EXPECT_EQ(tier.size(name), n);
    tier.read(name, dst, n + (4096 - n % 4096) % 4096).wait();
    ASSERT_EQ(std::memcmp(dst, data.data(), n), 0) << n << " bytes";
    tier.erase(name);
    pool.deallocate(src, n);
    pool.deallocate(dst, n);
  }
  const auto s = tier.stats();
  std::uint64_t pinned = 0;
  for (const auto& r : pool.regions()) pinned += r.bytes;
  // The thread queue has no fixed buffers; past its locked-memory limit a process gets none either.
  if (!on_threads && test::cannot_pin(pinned).empty()) {
    EXPECT_GT(s.fixed_buffer_ops, 0u);
  }
  EXPECT_EQ(s.stored_bytes, 0u);
  EXPECT_EQ(s.free_bytes, s.capacity_bytes);
}

TEST(NvmeTier, RoundTripsFromUnalignedBuffersGoThroughABounce) {
  test::temp_dir dir;
  nvme_tier tier(options_for({dir.path()}, 64_MiB));
  std::uint64_t seed = 100;
  for (std::size_t n : {std::size_t{1}, std::size_t{4097}, std::size_t{1_MiB + 3}, std::size_t{5_MiB + 77}}) {
    const auto data = test::random_bytes(n + 1, seed++);
    std::vector<unsigned char> back(n + 1, 0);
    const std::string name = "u" + std::to_string(n);
    tier.write(name, data.data() + 1, n).wait();  // odd address: never aligned
    tier.read(name, back.data() + 1, n).wait();
    ASSERT_EQ(std::memcmp(back.data() + 1, data.data() + 1, n), 0) << n;
    EXPECT_EQ(back[0], 0) << "read wrote before the buffer";
  }
  EXPECT_EQ(tier.stats().fixed_buffer_ops, 0u);  // no pool, no fixed buffers
}

TEST(NvmeTier, StripesBlocksOverSeveralDirectories) {
  test::temp_dir a, b;
  auto o = options_for({a.path(), b.path()}, 16_MiB);
  o.block_size = 1_MiB;
  nvme_tier tier(o);
  const auto data = test::random_bytes(4_MiB, 9);
  tier.write("striped", data.data(), data.size()).wait();
  const auto s = tier.stats();
  ASSERT_EQ(s.free_bytes_per_file.size(), 2u);
  EXPECT_EQ(s.free_bytes_per_file[0], 6_MiB);  // 2 of 8 blocks used in each file
  EXPECT_EQ(s.free_bytes_per_file[1], 6_MiB);
  std::vector<unsigned char> back(data.size());
  tier.read("striped", back.data()).wait();
  EXPECT_EQ(back, data);
}

TEST(NvmeTier, SeveralRingsAndSmallBlocksRoundTrip) {
  test::temp_dir dir;
  auto o = options_for({dir.path()}, 32_MiB);
  o.block_size = 64_KiB;
  o.queue_depth = 4;
  o.rings = 3;
  nvme_tier tier(o);
  const auto data = test::random_bytes(7_MiB + 5, 17);
  tier.write("x", data.data(), data.size()).wait();
  std::vector<unsigned char> back(data.size());
  tier.read("x", back.data()).wait();
  EXPECT_EQ(back, data);
}

// Each tensor takes whole blocks: small tensors fill the tier long before their bytes do, and
// the error says so, with what the blocks hold beside what they take.
TEST(NvmeTier, FullTierOfSmallTensorsSaysWhatTheBlocksHold) {
  test::temp_dir dir;
  nvme_tier tier(options_for({dir.path()}, 4_MiB));
  const auto small = test::random_bytes(3_KiB, 3);
  for (int i = 0; i < 4; ++i) tier.write("s" + std::to_string(i), small.data(), small.size()).wait();
  try {
    (void)tier.write("s4", small.data(), small.size());
    FAIL() << "four 1 MiB blocks hold four tensors, however small";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'s4'"), std::string::npos) << what;
    EXPECT_NE(what.find("in use 4.00 MiB (whole blocks) for 12.00 KiB of tensors"), std::string::npos) << what;
    EXPECT_NE(what.find("a block size nearer the tensors' sizes"), std::string::npos) << what;
  }
  std::vector<unsigned char> back(small.size());
  tier.read("s3", back.data()).wait();
  EXPECT_EQ(back, small);
}

TEST(NvmeTier, FullTierIsOutOfMemoryNamingTheTensorAndKeepsWhatIsStored) {
  test::temp_dir dir;
  nvme_tier tier(options_for({dir.path()}, 4_MiB));
  const auto a = test::random_bytes(3_MiB, 1);
  tier.write("a", a.data(), a.size()).wait();
  const auto b = test::random_bytes(2_MiB, 2);
  try {
    (void)tier.write("b", b.data(), b.size());
    FAIL() << "no error";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free 1.00 MiB"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(tier.contains("b"));
  // A tensor far past the tier (a petabyte: about a billion blocks) is refused at once as out of
  // swap space, before any list of its blocks is made (its bytes are never read).
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW((void)tier.write("huge", b.data(), std::size_t{1} << 50), out_of_memory);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_FALSE(tier.contains("huge"));
  std::vector<unsigned char> back(a.size());
  tier.read("a", back.data()).wait();
  EXPECT_EQ(back, a);
  tier.erase("a");
  tier.write("b", b.data(), b.size()).wait();  // the space came back
  EXPECT_TRUE(tier.contains("b"));
}

TEST(NvmeTier, MisuseIsAClearError) {
  test::temp_dir dir;
  nvme_tier tier(options_for({dir.path()}, 4_MiB));
  std::vector<unsigned char> buf(10, 1);
  EXPECT_THROW((void)tier.read("nope", buf.data()), error);
  EXPECT_THROW(tier.erase("nope"), error);
  tier.write("x", buf.data(), buf.size()).wait();
  EXPECT_THROW((void)tier.write("x", buf.data(), buf.size()), error);
  tier.write("empty", nullptr, 0).wait();
  EXPECT_TRUE(tier.contains("empty"));
  tier.read("empty", nullptr).wait();
}

TEST(NvmeTier, BadOptionsAreConfigErrors) {
  test::temp_dir dir;
  auto o = options_for({dir.path()}, 4_MiB);
  o.block_size = 1000;  // not a multiple of the alignment
  EXPECT_THROW(nvme_tier{o}, config_error);
  o = options_for({}, 4_MiB);
  EXPECT_THROW(nvme_tier{o}, config_error);
  o = options_for({dir.path()}, 4_MiB);
  o.queue_depth = 0;
  EXPECT_THROW(nvme_tier{o}, config_error);
  o = options_for({dir.path(), dir.path() + "/missing"}, 4_MiB);
  EXPECT_THROW(nvme_tier{o}, config_error);
  EXPECT_TRUE(dir.empty());
}

TEST(NvmeTier, BufferedFallbackStillRoundTrips) {
  test::temp_dir dir;
  auto previous = set_log_sink([](log_level, const std::string&) {});
  auto o = options_for({dir.path()}, 8_MiB);
  o.open_file = [](const std::string& path, int flags, mode_t mode) {
    if ((flags & O_DIRECT) != 0) return -EINVAL;
    const int fd = ::open(path.c_str(), flags, mode);
    return fd >= 0 ? fd : -errno;
  };
  {
    nvme_tier tier(o);
    EXPECT_FALSE(tier.direct_io());
    const auto data = test::random_bytes(2_MiB + 3, 5);
    tier.write("x", data.data(), data.size()).wait();
    std::vector<unsigned char> back(data.size());
    tier.read("x", back.data()).wait();
    EXPECT_EQ(back, data);
  }
  set_log_sink(previous);
}

TEST(NvmeTier, DevShmRoundTrips) {
  if (::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm";
  test::temp_dir dir("/dev/shm");
  auto previous = set_log_sink([](log_level, const std::string&) {});
  {
    nvme_tier tier(options_for({dir.path()}, 8_MiB));
    const auto data = test::random_bytes(3_MiB + 11, 6);
    tier.write("x", data.data(), data.size()).wait();
    std::vector<unsigned char> back(data.size());
    tier.read("x", back.data()).wait();
    EXPECT_EQ(back, data);
  }
  set_log_sink(previous);
}

TEST(NvmeTier, TooSmallDiskIsAnErrorAtStart) {
  test::temp_dir dir;
  try {
    nvme_tier tier(options_for({dir.path()}, 1ULL << 50));
    FAIL() << "no error";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos) << e.what();
  }
}

namespace {

// Counts registrations and submissions in the order they happen, around the real queue.
struct call_log {
  std::mutex m;
  std::vector<std::string> calls;
  std::vector<iovec> last_registered;
  void add(std::string c) {
    std::lock_guard lock(m);
    calls.push_back(std::move(c));
  }
};

class recording_queue final : public io_queue {
 public:
  recording_queue(std::unique_ptr<io_queue> inner, std::shared_ptr<call_log> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  [[nodiscard]] unsigned depth() const noexcept override { return inner_->depth(); }
  int register_buffers(std::span<const iovec> b) override {
    {
      std::lock_guard lock(log_->m);
      log_->calls.push_back("register");
      log_->last_registered.assign(b.begin(), b.end());
    }
    return inner_->register_buffers(b);
  }
  void unregister_buffers() noexcept override { inner_->unregister_buffers(); }
  std::size_t submit(std::span<io_op* const> ops) override {
    log_->add("submit");
    return inner_->submit(ops);
  }
  std::size_t reap(std::span<io_completion> out, std::chrono::microseconds timeout) override {
    return inner_->reap(out, timeout);
  }

 private:
  std::unique_ptr<io_queue> inner_;
  std::shared_ptr<call_log> log_;
};

}  // namespace

// huge_page_bytes is measured, not advised: what huge pages back of the registered region
// (allocate_pinned asked for them before anything pinned it), never more than the region, and
// 0 when the tier is told not to measure.
TEST(NvmeTier, RegistersThePoolsRegionsWhenMadeAndMeasuresTheirHugePages) {
  if (const auto why = test::cannot_pin(16_MiB); !why.empty()) GTEST_SKIP() << why;
  for (const bool huge : {true, false}) {
    test::temp_dir dir;
    cpu_device dev;
    pinned_host_pool pool(dev, {.capacity = 0, .region_size = 16_MiB, .alignment = 4096});
    auto* buf = static_cast<unsigned char*>(pool.allocate(8_MiB));
    const auto data = test::random_bytes(8_MiB, 31);
    std::memcpy(buf, data.data(), data.size());
    auto log = std::make_shared<call_log>();
    auto o = options_for({dir.path()}, 16_MiB);
    o.huge_pages = huge;
    o.make_queue = [log](unsigned d) -> std::unique_ptr<io_queue> {
      return std::make_unique<recording_queue>(make_uring_queue(d), log);
    };
    nvme_tier tier(o, &pool);
    {
      std::lock_guard lock(log->m);
      ASSERT_EQ(log->calls, std::vector<std::string>{"register"}) << "registered before any move";
      ASSERT_EQ(log->last_registered.size(), 1u);
      EXPECT_EQ(log->last_registered[0].iov_len, pool.regions().at(0).bytes);
    }
    // Registration kept the contents, and the round trip uses fixed buffers only.
    EXPECT_EQ(std::memcmp(buf, data.data(), data.size()), 0);
    tier.write("t", buf, data.size(), data.size()).wait();
    std::memset(buf, 0, data.size());
    tier.read("t", buf, data.size()).wait();
    EXPECT_EQ(std::memcmp(buf, data.data(), data.size()), 0);
    const auto s = tier.stats();
    EXPECT_EQ(s.fixed_buffer_ops, s.ops);
    const auto region = pool.regions().at(0);
    EXPECT_LE(s.huge_page_bytes, region.bytes) << "never more than the registered bytes";
    if (!huge) {
      EXPECT_EQ(s.huge_page_bytes, 0u) << "not measured";
    } else {
      // Registered pages are pinned, so they are as they were when the ring measured them.
      EXPECT_EQ(s.huge_page_bytes, detail::huge_page_backed_bytes(region.base, region.bytes));
      if (detail::transparent_huge_pages_enabled()) {
        EXPECT_GT(s.huge_page_bytes, 0u) << "allocate_pinned asked for huge pages before pinning";
      }
    }
    {
      std::lock_guard lock(log->m);
      EXPECT_EQ(std::count(log->calls.begin(), log->calls.end(), "register"), 1) << "no second registration";
    }
    pool.deallocate(buf, 8_MiB);
  }
}

// As the pool grows a region at a time, each new region is pinned once (into the next slot of a
// sparse table), not with every region before it again; data round-trips on fixed buffers only.
// A queue without slots falls back to registering the whole list, and still works.
TEST(NvmeTier, PinsEachNewPoolRegionOnceAsThePoolGrows) {
  if (const auto why = test::cannot_pin(6 * 4_MiB); !why.empty()) GTEST_SKIP() << why;
  for (const bool slots : {true, false}) {
    test::temp_dir dir;
    cpu_device dev;
    pinned_host_pool pool(dev, {.capacity = 0, .region_size = 4_MiB, .alignment = 4096});
    auto o = options_for({dir.path()}, 64_MiB);
    o.make_queue = nullptr;  // io_uring's own fixed buffers, in both builds of this file
    auto log = std::make_shared<call_log>();
    if (!slots)  // the recording queue has no slot table: whole-list registration
      o.make_queue = [log](unsigned d) -> std::unique_ptr<io_queue> {
        return std::make_unique<recording_queue>(make_uring_queue(d), log);
      };
    nvme_tier tier(o, &pool);
    constexpr int regions = 6;
    std::vector<unsigned char*> bufs;
    for (int i = 0; i < regions; ++i) {
      auto* b = static_cast<unsigned char*>(pool.allocate(3_MiB));  // too big for the last region's rest
      bufs.push_back(b);
      const auto data = test::random_bytes(3_MiB, 40 + static_cast<unsigned>(i));
      std::memcpy(b, data.data(), data.size());
      tier.write("t" + std::to_string(i), b, data.size(), data.size()).wait();
      std::memset(b, 0, data.size());
      tier.read("t" + std::to_string(i), b, data.size()).wait();
      EXPECT_EQ(std::memcmp(b, data.data(), data.size()), 0) << "tensor " << i;
    }
    ASSERT_EQ(pool.regions().size(), static_cast<std::size_t>(regions));
    const auto s = tier.stats();
    EXPECT_EQ(s.fixed_buffer_ops, s.ops) << "every op on a registered buffer";
    if (slots)
      EXPECT_EQ(s.region_pins, static_cast<std::uint64_t>(regions)) << "each region pinned once";
    else
      EXPECT_EQ(s.region_pins, static_cast<std::uint64_t>(regions * (regions + 1) / 2)) << "the whole list each time";
    for (auto* b : bufs) pool.deallocate(b, 3_MiB);
  }
}

// A region the pool unpins and pins again (mmap hands the same range back) is a new buffer to
// io_uring: registered again, so a fixed op moves the new pages, not the old ones it had pinned.
// Before region ids, the same address and size counted as the same region: the write sent the
// old pages' bytes and the read landed in them, and the CRC refused the read.
TEST(NvmeTier, ARegionPinnedAgainAtTheSameAddressIsRegisteredAgain) {
  if (const auto why = test::cannot_pin(2 * 4_MiB); !why.empty()) GTEST_SKIP() << why;
  test::temp_dir dir;
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 4_MiB, .alignment = 4096});
  auto o = options_for({dir.path()}, 64_MiB);
  o.make_queue = nullptr;  // io_uring's own fixed buffers
  nvme_tier tier(o, &pool);
  int reused = 0;
  void* last_base = nullptr;
  for (int round = 0; round < 4; ++round) {
    auto* b = static_cast<unsigned char*>(pool.allocate(3_MiB));
    const auto before = pool.regions();
    ASSERT_EQ(before.size(), 1u);
    const auto data = test::random_bytes(3_MiB, 70 + static_cast<unsigned>(round));
    std::memcpy(b, data.data(), data.size());
    const std::string name = "t" + std::to_string(round);
    tier.write(name, b, data.size(), data.size()).wait();
    std::memset(b, 0, data.size());
    tier.read(name, b, data.size()).wait();
    EXPECT_EQ(std::memcmp(b, data.data(), data.size()), 0) << "round " << round;
    tier.erase(name);
    pool.deallocate(b, 3_MiB);
    EXPECT_EQ(pool.release_unused(), 3_MiB);  // unpinned (a region of its own size): the next round pins a new one
    if (round > 0 && before[0].base == last_base) ++reused;
    last_base = before[0].base;
  }
  const auto s = tier.stats();
  EXPECT_EQ(s.fixed_buffer_ops, s.ops) << "every op on a registered buffer";
  EXPECT_EQ(s.region_pins, 4u) << "each region registered once, the ones at a reused address too";
  RecordProperty("rounds_at_a_reused_address", reused);  // 3 where mmap hands the freed range back
}

// The same while other I/O is in flight, when the ring may not register again: ops on a block
// of a region pinned since the last registration use plain buffers until it can, so they move
// the block's own pages.
TEST(NvmeTier, APoolChangeWithIoInFlightUsesPlainBuffersUntilRegisteredAgain) {
  if (const auto why = test::cannot_pin(3 * 4_MiB); !why.empty()) GTEST_SKIP() << why;
  test::temp_dir dir;
  cpu_device dev;
  pinned_host_pool pool(dev, {.capacity = 0, .region_size = 4_MiB, .alignment = 4096});
  auto plan = std::make_shared<test::fault_plan>();
  auto o = options_for({dir.path()}, 64_MiB);
  o.make_queue = test::faulty(plan);
  nvme_tier tier(o, &pool);
  auto* held = static_cast<unsigned char*>(pool.allocate(3_MiB));  // a region of its own
  auto* b = static_cast<unsigned char*>(pool.allocate(3_MiB));
  const auto first = test::random_bytes(3_MiB, 90);
  std::memcpy(b, first.data(), first.size());
  tier.write("b", b, first.size(), first.size()).wait();  // both regions registered
  const auto old_base = pool.regions().back().base;
  // The next write's first block completes but its completion is held: I/O stays in flight.
  plan->kind = io_kind::write;
  plan->writes = 0;
  plan->first = 1;
  plan->count = 1;
  plan->what = test::fault_plan::action::hold;
  const auto kept = test::random_bytes(3_MiB, 91);
  std::memcpy(held, kept.data(), kept.size());
  auto pending = tier.write("held", held, kept.size(), kept.size());
  while (plan->held.load() == 0) std::this_thread::yield();
  plan->disarm();
  // b's region goes and a new one comes, most likely at its address.
  tier.erase("b");
  pool.deallocate(b, 3_MiB);
  ASSERT_EQ(pool.release_unused(), 3_MiB);
  auto* c = static_cast<unsigned char*>(pool.allocate(3_MiB));
  const auto data = test::random_bytes(3_MiB, 92);
  std::memcpy(c, data.data(), data.size());
  tier.write("c", c, data.size(), data.size()).wait();
  std::memset(c, 0, data.size());
  tier.read("c", c, data.size()).wait();
  EXPECT_EQ(std::memcmp(c, data.data(), data.size()), 0) << "the ops on the new region moved other pages"
                                                          << (pool.regions().back().base == old_base ? " (same address)" : "");
  plan->release_held = true;
  pending.wait();
  std::memset(held, 0, kept.size());
  tier.read("held", held, kept.size()).wait();
  EXPECT_EQ(std::memcmp(held, kept.data(), kept.size()), 0);
  const auto s = tier.stats();
  EXPECT_LT(s.fixed_buffer_ops, s.ops) << "the ops while the registration was stale used plain buffers";
  pool.deallocate(c, 3_MiB);
  pool.deallocate(held, 3_MiB);
}

// ---- growing the reservation (session_config's nvme.reserve 0: sized from the plan) ------------

TEST(NvmeTier, ReserveGrowsEveryFileAndKeepsWhatIsStored) {
  test::temp_dir a, b;
  nvme_tier tier(options_for({a.path(), b.path()}, 8_MiB));
  EXPECT_EQ(tier.stats().capacity_bytes, 8_MiB);
  const auto first = test::random_bytes(6_MiB + 5, 7);
  tier.write("first", first.data(), first.size()).wait();
  EXPECT_THROW((void)tier.write("big", first.data(), 6_MiB), out_of_memory) << "8 MiB cannot hold both";

  tier.reserve(41_MiB);  // 20.5 MiB a file, rounded up to whole 1 MiB blocks
  EXPECT_EQ(tier.stats().capacity_bytes, 42_MiB);
  tier.reserve(10_MiB);  // smaller: nothing changes
  EXPECT_EQ(tier.stats().capacity_bytes, 42_MiB);
  const auto second = test::random_bytes(30_MiB, 8);
  tier.write("second", second.data(), second.size()).wait();

  std::vector<unsigned char> back(first.size());
  tier.read("first", back.data()).wait();
  EXPECT_EQ(back, first);
  back.assign(second.size(), 0);
  tier.read("second", back.data()).wait();
  EXPECT_EQ(back, second);
  EXPECT_GE(tier.reservable_bytes(), tier.stats().capacity_bytes);
}

TEST(NvmeTier, ReservePastTheDiskIsOutOfMemoryNamingTheDirectory) {
  test::temp_dir dir;
  nvme_tier tier(options_for({dir.path()}, 4_MiB));
  const std::uint64_t most = tier.reservable_bytes();
  ASSERT_GE(most, 4_MiB);
  if (most + 1_GiB > max_size_bytes) GTEST_SKIP() << "file system too large to overfill";
  try {
    tier.reserve(most + 1_GiB);
    FAIL() << "reserved more than the disk has";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tier.stats().capacity_bytes, 4_MiB) << "a failed reserve leaves the tier as it was";
}

TEST(NvmeTier, GrowOnDemandMakesRoomForAWriteInsteadOfFailing) {
  test::temp_dir dir;
  auto o = options_for({dir.path()}, 2_MiB);
  o.grow_on_demand = true;
  nvme_tier tier(o);
  const auto data = test::random_bytes(9_MiB + 1, 9);
  tier.write("t", data.data(), data.size()).wait();
  EXPECT_GE(tier.stats().capacity_bytes, 10_MiB);
  std::vector<unsigned char> back(data.size());
  tier.read("t", back.data()).wait();
  EXPECT_EQ(back, data);
}

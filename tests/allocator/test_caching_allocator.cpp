// Tests of the device caching allocator: rounding and pools, stream-aware reuse (a slow stream's
// block is never reused early), budget and out-of-memory diagnosis, snapshots, and a property
// test of 100,000 random operations over several streams against a reference model.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "allocator/snapshot.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"

using namespace spillway;
using namespace spillway::literals;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<cpu_device> cpu(std::size_t memory = 256_MiB) {
  device_options o;
  o.cpu_device_memory = memory;
  return std::make_unique<cpu_device>(o);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace

TEST(CachingAllocator, RoundsTo512AndCachesSegments) {
  auto dev = cpu();
  owned_stream s(*dev);
  caching_allocator ca(*dev);
  void* p = ca.allocate(1000, s);
  auto st = ca.stats();
  EXPECT_EQ(st.allocated_bytes.current, 1024);
  EXPECT_EQ(st.requested_bytes.current, 1000);
  EXPECT_EQ(st.reserved_bytes.current, static_cast<std::int64_t>(2_MiB)) << "small pool segment";
  EXPECT_EQ(st.segment_count.current, 1);
  EXPECT_EQ(ca.allocated_bytes(), 1024u);
  void* q = ca.allocate(3_MiB, s);
  EXPECT_EQ(ca.reserved_bytes(), 2_MiB + 20_MiB) << "large pool segment for a request under 10 MiB";
  void* r = ca.allocate(17_MiB + 1, s);  // more than the 17 MiB left in the 20 MiB segment
  EXPECT_EQ(ca.reserved_bytes(), 2_MiB + 20_MiB + 18_MiB) << "a large request gets its size rounded to 2 MiB";
  ca.deallocate(p, 1000, s);
  ca.deallocate(q, 3_MiB, s);
  ca.deallocate(r, 17_MiB + 1, s);
  EXPECT_EQ(ca.allocated_bytes(), 0u);
  EXPECT_EQ(ca.reserved_bytes(), 40_MiB) << "freed blocks stay cached";
  void* again = ca.allocate(1000, s);
  EXPECT_EQ(again, p) << "the cached block is reused on the same stream";
  ca.deallocate(again, 1000, s);
  EXPECT_EQ(dev->used_memory(), 40_MiB);
  EXPECT_EQ(ca.empty_cache(), 40_MiB);
  EXPECT_EQ(ca.reserved_bytes(), 0u);
  EXPECT_EQ(dev->used_memory(), 0u);
  st = ca.stats();
  EXPECT_EQ(st.allocated_bytes.peak, static_cast<std::int64_t>(1024 + 3_MiB + 18_MiB))
      << "the 1 MiB - 512 B tail is too small to split off a large block";
  EXPECT_EQ(st.allocation_count.allocated, 4);
  EXPECT_EQ(st.num_segment_releases, 3u);
  ca.check_invariants();
}

TEST(CachingAllocator, SplitsAndCoalesces) {
  auto dev = cpu();
  owned_stream s(*dev);
  caching_allocator ca(*dev);
  std::vector<void*> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(ca.allocate(256_KiB, s));
  for (int i = 1; i < 4; ++i) EXPECT_EQ(static_cast<char*>(ps[i]), static_cast<char*>(ps[i - 1]) + 256_KiB);
  ca.deallocate(ps[1], 256_KiB, s);
  ca.deallocate(ps[2], 256_KiB, s);
  void* big = ca.allocate(512_KiB, s);
  EXPECT_EQ(big, ps[1]) << "the two freed neighbours merged into one 512 KiB block";
  ca.check_invariants();
  ca.deallocate(big, 512_KiB, s);
  ca.deallocate(ps[0], 256_KiB, s);
  ca.deallocate(ps[3], 256_KiB, s);
  const auto segs = ca.segments();
  ASSERT_EQ(segs.size(), 1u);
  ASSERT_EQ(segs[0].blocks.size(), 1u) << "everything merged back into one block";
  EXPECT_EQ(segs[0].blocks[0].size, 2_MiB);
  ca.check_invariants();
}

// Note [Stream reuse]: a block freed on a slow stream must not be handed to another stream
// until the slow stream has finished the work queued before the free. The checks run inside
// the stream work, so an allocator that reuses early makes this test fail.
TEST(CachingAllocatorStreams, BlockFreedOnSlowStreamIsNotReusedBeforeItsWorkFinishes) {
  for (std::size_t budget : {std::size_t{256_MiB}, std::size_t{16_MiB}}) {
    SCOPED_TRACE("budget " + format_bytes(budget));
    auto dev = cpu();
    owned_stream slow(*dev), fast(*dev);
    caching_allocator ca(*dev, {.budget = budget});
    const std::size_t n = 12_MiB;  // one block fills its segment exactly
    auto* p = static_cast<unsigned char*>(ca.allocate(n, slow));
    dev->set_stream_delay(slow, 30ms);
    std::atomic<bool> slow_done{false}, slow_saw_clobber{false}, early_reuse{false};
    dev->launch_kernel(slow, [p, n] { std::memset(p, 0xAA, n); });
    dev->launch_kernel(slow, [&, p, n] {
      for (std::size_t i = 0; i < n; i += 4096)
        if (p[i] != 0xAA) slow_saw_clobber = true;
      slow_done = true;
    });
    ca.deallocate(p, n, slow);
    auto* q = static_cast<unsigned char*>(ca.allocate(n, fast));
    dev->launch_kernel(fast, [&, p, q, n] {
      if (overlaps(p, n, q, n) && !slow_done) early_reuse = true;
      std::memset(q, 0xBB, n);
    });
    dev->synchronize();
    EXPECT_FALSE(early_reuse) << "reused by another stream before the slow stream finished";
    EXPECT_FALSE(slow_saw_clobber);
    if (budget == 16_MiB) {
      EXPECT_EQ(q, p) << "with no room to grow, the allocator waits for the slow stream and reuses";
      EXPECT_GE(ca.stats().num_alloc_retries, 1u);
    } else {
      EXPECT_NE(q, p) << "with room to grow, the allocator does not wait";
    }
    ca.deallocate(q, n, fast);
    dev->set_stream_delay(slow, 0ns);
    ca.check_invariants();
    EXPECT_GE(ca.stats().num_stream_handoffs, 1u);
  }
}

TEST(CachingAllocatorStreams, HandedOverBlocksAreReusedOnceTheStreamIsDone) {
  auto dev = cpu();
  owned_stream a(*dev), b(*dev);
  caching_allocator ca(*dev);
  void* p = ca.allocate(12_MiB, a);
  std::atomic<bool> go{false};
  dev->launch_kernel(a, [&go] { while (!go.load()) std::this_thread::yield(); });  // a is busy
  ca.deallocate(p, 12_MiB, a);
  void* q = ca.allocate(12_MiB, b);  // a's block goes pending behind an event; b gets a new segment
  EXPECT_NE(q, p);
  go = true;
  dev->synchronize_stream(a);
  void* r = ca.allocate(12_MiB, b);  // the event is done: a's block is now free on any stream
  EXPECT_EQ(r, p);
  EXPECT_EQ(ca.reserved_bytes(), 24_MiB);
  ca.deallocate(q, 12_MiB, b);
  ca.deallocate(r, 12_MiB, b);
  ca.check_invariants();
}

TEST(CachingAllocatorBudget, BudgetAboveTheDeviceIsAConfigErrorQuotingBoth) {
  auto dev = cpu(64_MiB);
  const std::string msg = message_of([&] { caching_allocator ca(*dev, {.budget = 100_MiB}); });
  EXPECT_NE(msg.find("100.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("64.00 MiB"), std::string::npos) << msg;
  EXPECT_THROW(caching_allocator(*dev, {.budget = 100_MiB}), config_error);
  caching_allocator ca(*dev, {.budget = 32_MiB});
  EXPECT_EQ(ca.budget(), 32_MiB);
  EXPECT_THROW(ca.set_budget(0), config_error);
  EXPECT_THROW(ca.set_budget(65_MiB), config_error);
  caching_allocator whole(*dev);
  EXPECT_EQ(whole.budget(), 64_MiB) << "0 means the device's total memory";
}

TEST(CachingAllocatorBudget, OutOfMemoryMessageIsADiagnosis) {
  auto dev = cpu();
  owned_stream s(*dev);
  caching_allocator ca(*dev, {.budget = 40_MiB});
  void* a = ca.allocate(12_MiB, s);
  void* b = ca.allocate(20_MiB, s);
  void* c = ca.allocate(1_MiB + 512, s);  // under budget pressure the segment is sized to the request
  EXPECT_LE(ca.reserved_bytes(), 40_MiB);
  const std::string msg = message_of([&] { (void)ca.allocate(10_MiB, s); });
  for (const char* part : {"out of memory allocating 10.00 MiB", "10485760 bytes", "Budget 40.00 MiB",
                           "allocated 34.00 MiB", "reserved 34.00 MiB", "largest free block 0 B", "the device has"})
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  EXPECT_THROW((void)ca.allocate(10_MiB, s), out_of_memory);
  EXPECT_EQ(ca.stats().num_ooms, 2u);
  EXPECT_LE(ca.reserved_bytes(), 40_MiB);
  ca.deallocate(a, 12_MiB, s);
  ca.deallocate(b, 20_MiB, s);
  ca.deallocate(c, 1_MiB + 512, s);
  ca.check_invariants();
}

TEST(CachingAllocatorBudget, ReleasesCachedSegmentsAndRetriesBeforeFailing) {
  auto dev = cpu();
  owned_stream s(*dev);
  caching_allocator ca(*dev, {.budget = 48_MiB});
  std::vector<void*> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(ca.allocate(12_MiB, s));
  for (void* p : ps) ca.deallocate(p, 12_MiB, s);
  EXPECT_EQ(ca.reserved_bytes(), 48_MiB) << "four cached 12 MiB segments";
  void* big = ca.allocate(40_MiB, s);  // no cached block fits; releasing the cache makes room
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(ca.reserved_bytes(), 40_MiB);
  EXPECT_EQ(ca.stats().num_alloc_retries, 1u);
  EXPECT_EQ(ca.stats().num_segment_releases, 4u);
  ca.deallocate(big, 40_MiB, s);
  ca.check_invariants();
}

TEST(CachingAllocatorBudget, SetBudgetBelowReservedReleasesCache) {
  auto dev = cpu();
  owned_stream s(*dev);
  caching_allocator ca(*dev);
  void* p = ca.allocate(12_MiB, s);
  void* q = ca.allocate(12_MiB, s);
  ca.deallocate(q, 12_MiB, s);
  ca.set_budget(16_MiB);
  EXPECT_EQ(ca.reserved_bytes(), 12_MiB);
  EXPECT_THROW((void)ca.allocate(12_MiB, s), out_of_memory);
  ca.deallocate(p, 12_MiB, s);
}

TEST(CachingAllocatorSnapshot, UsesPyTorchFieldNames) {
  auto dev = cpu();
  owned_stream s(*dev);
  caching_allocator ca(*dev);
  void* p = ca.allocate(1000, s);
  void* q = ca.allocate(3_MiB, s);
  ca.deallocate(q, 3_MiB, s);
  const auto j = memory_snapshot(ca);
  ASSERT_TRUE(j.contains("segments"));
  ASSERT_EQ(j["segments"].size(), 2u);
  std::size_t active = 0, inactive = 0;
  for (const auto& seg : j["segments"]) {
    for (const char* f : {"address", "total_size", "stream", "segment_type", "blocks", "allocated_size"})
      EXPECT_TRUE(seg.contains(f)) << f;
    std::size_t sum = 0;
    for (const auto& b : seg["blocks"]) {
      for (const char* f : {"address", "size", "state", "requested_size"}) EXPECT_TRUE(b.contains(f)) << f;
      sum += b["size"].get<std::size_t>();
      const auto state = b["state"].get<std::string>();
      if (state == "active_allocated") ++active;
      if (state == "inactive") ++inactive;
    }
    EXPECT_EQ(sum, seg["total_size"].get<std::size_t>());
  }
  EXPECT_EQ(active, 1u);
  EXPECT_EQ(inactive, 2u);
  EXPECT_EQ(j["stats"]["allocated_bytes"]["current"].get<std::int64_t>(), 1024);
  EXPECT_EQ(j["stats"]["reserved_bytes"]["peak"].get<std::int64_t>(), static_cast<std::int64_t>(22_MiB));
  ca.deallocate(p, 1000, s);
}

// Property: 100,000 random allocate/free operations over four streams (one of them slow) against
// a reference model. Live blocks never overlap; each keeps a pattern written on its stream until
// the free (checked by work on the freeing stream, so early cross-stream reuse shows up);
// statistics match the model; reserved bytes stay within the budget; everything goes back.
TEST(CachingAllocatorProperty, RandomOperationsOverStreamsMatchReferenceModel) {
  auto dev = cpu(512_MiB);
  std::vector<std::unique_ptr<owned_stream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(std::make_unique<owned_stream>(*dev));
  dev->set_stream_delay(*streams[3], 20us);
  caching_allocator ca(*dev, {.budget = 96_MiB});
  struct live {
    std::size_t bytes;
    int stream;
    unsigned char tag;
  };
  std::map<std::uintptr_t, live> model;
  std::atomic<long> corrupted{0};
  std::mt19937_64 rng(2024);
  std::int64_t requested = 0, count = 0, rounded = 0;
  long ooms = 0;
  auto size_of = [&]() -> std::size_t {
    const auto r = rng() % 100;
    if (r < 60) return 1 + rng() % 16_KiB;
    if (r < 85) return 1 + rng() % 1_MiB;
    if (r < 97) return 1_MiB + rng() % 8_MiB;
    return 10_MiB + rng() % 12_MiB;
  };
  constexpr int operations = 100000;
  for (int op = 0; op < operations; ++op) {
    const int si = static_cast<int>(rng() % streams.size());
    stream s = *streams[si];
    if (model.empty() || rng() % 100 < 52) {
      const std::size_t n = size_of();
      void* p = nullptr;
      try {
        p = ca.allocate(n, s);
      } catch (const out_of_memory&) {
        ++ooms;
        continue;
      }
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      ASSERT_EQ(a % 256, 0u);
      auto next = model.lower_bound(a);
      if (next != model.end()) {
        ASSERT_LE(a + n, next->first) << "overlaps a live block";
      }
      if (next != model.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second.bytes, a) << "overlaps a live block";
      }
      const live l{n, si, static_cast<unsigned char>(rng() | 1)};
      model.emplace(a, l);
      dev->launch_kernel(s, [p, l] {
        auto* b = static_cast<unsigned char*>(p);
        b[0] = l.tag;
        b[l.bytes / 2] = l.tag;
        b[l.bytes - 1] = l.tag;
      });
      requested += static_cast<std::int64_t>(n);
      rounded += static_cast<std::int64_t>((n + 511) / 512 * 512);
      ++count;
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % std::min<std::size_t>(model.size(), 64)));
      auto [a, l] = *it;
      // Free on the allocating stream, or hand the block to another stream first (its last use).
      stream last = *streams[l.stream];
      if (rng() % 4 == 0) {
        const int other = static_cast<int>(rng() % streams.size());
        owned_event e(*dev);
        dev->record_event(e, last);
        dev->stream_wait_event(*streams[other], e);
        last = *streams[other];
      }
      dev->launch_kernel(last, [&corrupted, a, l] {
        const auto* b = reinterpret_cast<const unsigned char*>(a);
        if (b[0] != l.tag || b[l.bytes / 2] != l.tag || b[l.bytes - 1] != l.tag) ++corrupted;
      });
      ca.deallocate(reinterpret_cast<void*>(a), l.bytes, last);
      requested -= static_cast<std::int64_t>(l.bytes);
      rounded -= static_cast<std::int64_t>((l.bytes + 511) / 512 * 512);
      --count;
      model.erase(it);
    }
    ASSERT_LE(ca.reserved_bytes(), 96_MiB);
    if (op % 1000 == 0) {
      const auto st = ca.stats();
      ASSERT_EQ(st.requested_bytes.current, requested);
      ASSERT_EQ(st.allocation_count.current, count);
      ASSERT_GE(st.allocated_bytes.current, rounded);
      ASSERT_LT(st.allocated_bytes.current, rounded + count * static_cast<std::int64_t>(1_MiB + 512));
      ca.check_invariants();
    }
    if (op % 20000 == 0) ca.empty_cache();
  }
  for (auto& [a, l] : model) ca.deallocate(reinterpret_cast<void*>(a), l.bytes, *streams[l.stream]);
  dev->synchronize();
  EXPECT_EQ(corrupted.load(), 0) << "a block's pattern changed before it was freed";
  EXPECT_LT(ooms, operations / 10) << "the budget is meant to bind only now and then";
  const auto st = ca.stats();
  EXPECT_EQ(st.allocated_bytes.current, 0);
  EXPECT_EQ(st.requested_bytes.current, 0);
  EXPECT_GT(st.num_stream_handoffs, 0u);
  ca.empty_cache();
  EXPECT_EQ(ca.reserved_bytes(), 0u);
  EXPECT_EQ(ca.stats().segment_count.current, 0);
  EXPECT_EQ(dev->used_memory(), 0u);
  ca.check_invariants();
}

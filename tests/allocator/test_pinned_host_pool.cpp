// Tests of the pinned host pool: carving, coalescing, capacity, regions, bad input, and a random
// alloc/free property test against a reference model, plus the overhead bound on a mixed workload.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "allocator/pinned_host_pool.hpp"
#include "device/cpu_device.hpp"
#include "device/error.hpp"
#include "device/units.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

device_options cpu_options() {
  device_options o;
  o.cpu_device_memory = 64_MiB;
  return o;
}

std::unique_ptr<Device> cpu() { return make_device("cpu", cpu_options()); }

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace

TEST(PinnedHostPool, BlocksAreAlignedAndRoundedToTheAlignmentOnly) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 64_MiB, .alignment = 4096});
  void* a = pool.allocate(5_MiB + 1);
  void* b = pool.allocate(100);
  EXPECT_EQ(addr(a) % 4096, 0u);
  EXPECT_EQ(addr(b) % 4096, 0u);
  const auto s = pool.stats();
  EXPECT_EQ(s.requested_bytes, 5_MiB + 1 + 100);
  EXPECT_EQ(s.allocated_bytes, 5_MiB + 4096 + 4096) << "no power-of-two rounding";
  EXPECT_EQ(s.reserved_bytes, 64_MiB);
  EXPECT_EQ(s.regions, 1u);
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(addr(b), addr(a) + 5_MiB + 4096) << "the second block is carved right after the first";
  std::memset(a, 1, 5_MiB + 1);
  std::memset(b, 2, 100);
  pool.check_invariants();
  pool.deallocate(a, 5_MiB + 1);
  pool.deallocate(b, 100);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.largest_free_block(), 64_MiB) << "freed blocks coalesce back into the whole region";
  pool.check_invariants();
}

TEST(PinnedHostPool, LargerAlignmentIsHonoured) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 8_MiB, .alignment = 2_MiB});
  std::vector<void*> ps;
  for (int i = 0; i < 5; ++i) ps.push_back(pool.allocate(1_MiB + 7));
  for (void* p : ps) EXPECT_EQ(addr(p) % (2_MiB), 0u);
  for (void* p : ps) pool.deallocate(p, 1_MiB + 7);
  pool.check_invariants();
}

TEST(PinnedHostPool, BestFitPicksTheSmallestFreeBlockThatFits) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 16_MiB});
  void* a = pool.allocate(1_MiB);
  void* gap_big = pool.allocate(3_MiB);
  void* b = pool.allocate(1_MiB);
  void* gap_small = pool.allocate(2_MiB);
  void* c = pool.allocate(1_MiB);
  pool.deallocate(gap_big, 3_MiB);
  pool.deallocate(gap_small, 2_MiB);
  void* x = pool.allocate(2_MiB - 100);
  EXPECT_EQ(x, gap_small) << "the 2 MiB hole fits exactly; the 3 MiB hole and the tail are larger";
  void* y = pool.allocate(1_MiB);
  EXPECT_EQ(y, gap_big) << "split from the 3 MiB hole";
  void* z = pool.allocate(2_MiB);
  EXPECT_EQ(addr(z), addr(gap_big) + 1_MiB) << "the rest of the split hole";
  for (auto [p, n] : {std::pair{a, 1_MiB}, {b, 1_MiB}, {c, 1_MiB}, {x, 2_MiB - 100}, {y, 1_MiB}, {z, 2_MiB}})
    pool.deallocate(p, n);
  pool.check_invariants();
  EXPECT_EQ(pool.largest_free_block(), 16_MiB);
}

TEST(PinnedHostPool, LargeRequestGetsARegionOfItsOwnAndRegionsAreReported) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 4_MiB});
  void* small = pool.allocate(64_KiB);
  void* big = pool.allocate(10_MiB + 5);
  auto rs = pool.regions();
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].bytes, 4_MiB);
  EXPECT_EQ(rs[1].bytes, 10_MiB + 4096) << "sized to the request, not to a power of two";
  EXPECT_EQ(pool.region_index(small), 0);
  EXPECT_EQ(pool.region_index(big), 1);
  EXPECT_EQ(pool.region_index(static_cast<char*>(big) + 10_MiB), 1);
  int outside = 0;
  EXPECT_EQ(pool.region_index(&outside), -1);
  pool.deallocate(big, 10_MiB + 5);
  EXPECT_EQ(pool.release_unused(), 10_MiB + 4096);
  EXPECT_EQ(pool.regions().size(), 1u);
  EXPECT_EQ(pool.region_index(small), 0);
  pool.deallocate(small, 64_KiB);
  EXPECT_EQ(pool.release_unused(), 4_MiB);
  EXPECT_TRUE(pool.regions().empty());
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 14_MiB + 4096);
  pool.check_invariants();
}

TEST(PinnedHostPool, CapacityLimitGivesADiagnosingOutOfMemory) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 10_MiB, .region_size = 4_MiB});
  void* a = pool.allocate(4_MiB);
  void* b = pool.allocate(4_MiB);
  void* c = pool.allocate(1_MiB);  // the last region is shrunk to the 2 MiB the capacity leaves
  EXPECT_EQ(pool.stats().reserved_bytes, 10_MiB);
  const std::string msg = message_of([&] { (void)pool.allocate(2_MiB); });
  EXPECT_NE(msg.find("out of memory allocating 2.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("capacity 10.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reserved 10.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allocated 9.00 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("largest free block 1.00 MiB"), std::string::npos) << msg;
  EXPECT_THROW((void)pool.allocate(2_MiB), out_of_memory);
  void* d = pool.allocate(1_MiB);  // what is left still serves
  pool.check_invariants();
  pool.deallocate(a, 4_MiB);
  pool.deallocate(b, 4_MiB);
  pool.deallocate(c, 1_MiB);
  pool.deallocate(d, 1_MiB);
  // Empty regions are unpinned to make room for a request no single one of them can hold.
  void* e = pool.allocate(9_MiB);
  EXPECT_LE(pool.stats().reserved_bytes, 10_MiB);
  pool.deallocate(e, 9_MiB);
  pool.check_invariants();
}

TEST(PinnedHostPool, BadInputIsAClearError) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 1_MiB});
  std::string msg = message_of([&] { (void)pool.allocate(0); });
  EXPECT_NE(msg.find("cannot allocate 0 B"), std::string::npos) << msg;
  EXPECT_THROW((void)pool.allocate(0), config_error);
  EXPECT_THROW((void)pool.allocate(max_size_bytes + 1), config_error);
  msg = message_of([&] { pinned_host_pool p(*dev, {.capacity = 0, .region_size = 1_MiB, .alignment = 3000}); });
  EXPECT_NE(msg.find("3000"), std::string::npos) << msg;
  EXPECT_THROW(pinned_host_pool(*dev, {.capacity = 0, .region_size = 0}), config_error);
  EXPECT_THROW(pinned_host_pool(*dev, {.capacity = max_size_bytes * 2}), config_error);
  pool.deallocate(nullptr, 0);  // a no-op
  EXPECT_EQ(pool.stats().allocations, 0u);
}

// Property: random allocations and frees against a reference model. Live blocks never overlap
// and stay inside one region, each keeps the pattern written into it, stats match the model,
// and the pool's own invariant walk passes.
TEST(PinnedHostPool, RandomAllocFreeMatchesReferenceModel) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 96_MiB, .region_size = 8_MiB});
  struct live {
    std::size_t bytes;
    unsigned char tag;
  };
  std::map<std::uintptr_t, live> model;  // by address
  std::mt19937_64 rng(spillway::test::test_seed(12345));
  std::size_t requested = 0, rounded = 0, allocations = 0, refusals = 0;
  auto pattern_ok = [](const live& l, const unsigned char* p) {
    const std::size_t probe[] = {0, l.bytes / 2, l.bytes - 1};
    for (std::size_t i : probe)
      if (p[i] != static_cast<unsigned char>(l.tag + i % 7)) return false;
    return true;
  };
  auto size_of = [&] {
    switch (rng() % 4) {
      case 0: return std::size_t{1} + rng() % 4096;
      case 1: return std::size_t{1} + rng() % 256_KiB;
      case 2: return std::size_t{1} + rng() % 3_MiB;
      default: return std::size_t{1} + rng() % 12_MiB;  // some larger than a region
    }
  };
  for (int step = 0; step < 20000; ++step) {
    if (model.empty() || rng() % 100 < 55) {
      const std::size_t n = size_of();
      void* p = nullptr;
      try {
        p = pool.allocate(n);
      } catch (const out_of_memory&) {
        // Refused only when no free block fits and no new region of that size fits the capacity.
        const std::size_t need = (n + 4095) / 4096 * 4096;
        EXPECT_LT(pool.largest_free_block(), need);
        EXPECT_GT(pool.stats().reserved_bytes + need, 96_MiB);
        ++refusals;
        continue;
      }
      const auto a = addr(p);
      ASSERT_EQ(a % 4096, 0u);
      auto next = model.lower_bound(a);
      if (next != model.end()) {
        ASSERT_LE(a + n, next->first) << "overlaps the next live block";
      }
      if (next != model.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.bytes, a) << "overlaps the previous live block";
      }
      const int r = pool.region_index(p);
      ASSERT_GE(r, 0);
      ASSERT_EQ(pool.region_index(static_cast<char*>(p) + n - 1), r) << "block crosses a region";
      const live l{n, static_cast<unsigned char>(rng())};
      auto* bytes = static_cast<unsigned char*>(p);
      for (std::size_t i : {std::size_t{0}, n / 2, n - 1}) bytes[i] = static_cast<unsigned char>(l.tag + i % 7);
      model.emplace(a, l);
      requested += n;
      rounded += (n + 4095) / 4096 * 4096;
      ++allocations;
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % model.size()));
      ASSERT_TRUE(pattern_ok(it->second, reinterpret_cast<unsigned char*>(it->first))) << "block contents changed";
      pool.deallocate(reinterpret_cast<void*>(it->first), it->second.bytes);
      requested -= it->second.bytes;
      rounded -= (it->second.bytes + 4095) / 4096 * 4096;
      model.erase(it);
    }
    const auto s = pool.stats();
    ASSERT_EQ(s.requested_bytes, requested);
    ASSERT_EQ(s.allocated_bytes, rounded);
    ASSERT_EQ(s.allocations, allocations);
    ASSERT_LE(s.reserved_bytes, 96_MiB);
    ASSERT_GE(s.reserved_bytes, s.allocated_bytes);
    if (step % 500 == 0) {
      pool.check_invariants();
      if (step % 2000 == 0) pool.release_unused();
    }
  }
  EXPECT_GT(refusals, 0u) << "the workload should reach the capacity now and then";
  for (auto& [a, l] : model) {
    ASSERT_TRUE(pattern_ok(l, reinterpret_cast<unsigned char*>(a)));
    pool.deallocate(reinterpret_cast<void*>(a), l.bytes);
  }
  pool.check_invariants();
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  pool.release_unused();
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_TRUE(pool.regions().empty());
}

// Overhead on a realistic mixed workload: the host tier of a 16-layer transformer keeps the
// weights and both Adam moments (several shapes, odd-sized biases and norms) for the whole run,
// and each iteration offloads every layer's activations in the forward pass and frees them in
// reverse in the backward pass; the batch size changes once midway. At each iteration's peak,
// reserved bytes stay within 5% of requested bytes.
TEST(PinnedHostPool, OverheadStaysWithinFivePercentOnMixedWorkload) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 64_MiB});
  const std::size_t hidden = 2048, ffn = 5504, vocab = 32001, seq = 1000, layers = 16;
  std::vector<std::pair<void*, std::size_t>> resident;
  auto keep = [&](std::size_t n) { resident.emplace_back(pool.allocate(n), n); };
  for (int copy = 0; copy < 3; ++copy) {  // weights, Adam m, Adam v (fp32 moments: twice the bytes)
    const std::size_t w = copy == 0 ? 2 : 4;
    keep(vocab * hidden * w);
    for (std::size_t l = 0; l < layers; ++l) {
      for (std::size_t n : {3 * hidden * hidden, 3 * hidden, hidden * hidden, hidden, 2 * hidden * ffn, 2 * ffn,
                            ffn * hidden, hidden, hidden, hidden, hidden, hidden})
        keep(n * w);
    }
  }
  double worst = 0;
  for (int iteration = 0; iteration < 8; ++iteration) {
    const std::size_t batch = iteration < 4 ? 4 : 6;
    std::vector<std::pair<void*, std::size_t>> acts;
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t tokens = batch * seq;
      for (std::size_t n : {tokens * hidden * 2, tokens * 3 * hidden * 2, tokens * hidden * 2, tokens * ffn * 2,
                            tokens * 4 + 12, tokens * hidden * 2})
        acts.emplace_back(pool.allocate(n), n);
    }
    const auto s = pool.stats();
    worst = std::max(worst, static_cast<double>(s.reserved_bytes) / static_cast<double>(s.requested_bytes) - 1.0);
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) pool.deallocate(it->first, it->second);
  }
  EXPECT_LE(worst, 0.05) << "reserved over requested at an iteration's peak";
  RecordProperty("overhead", std::to_string(worst));
  for (auto& [p, n] : resident) pool.deallocate(p, n);
  pool.check_invariants();
}

TEST(PinnedHostPool, ConcurrentAllocFreeKeepsBlocksDisjoint) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 8_MiB});
  constexpr int threads = 4;
  std::vector<std::thread> ts;
  std::atomic<int> corrupted{0};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<unsigned char*, std::size_t>> mine;
      for (int i = 0; i < 3000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t n = 1 + rng() % 200_KiB;
          auto* p = static_cast<unsigned char*>(pool.allocate(n));
          std::memset(p, t + 1, n);
          mine.emplace_back(p, n);
        } else {
          const std::size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          for (std::size_t j = 0; j < n; j += 997) {
            if (p[j] != t + 1) ++corrupted;
          }
          pool.deallocate(p, n);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (auto [p, n] : mine) pool.deallocate(p, n);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(corrupted.load(), 0);
  pool.check_invariants();
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

// A region size that is not a whole number of pages is rounded up to the next page (or to the
// alignment when that is larger), and the blocks carved from such regions still tile them.
TEST(PinnedHostPool, ARegionSizeOffThePageIsRoundedUpToThePage) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 1_MiB + 1});
  EXPECT_EQ(pool.options().region_size, 1_MiB + 4096);
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t n : {std::size_t{100}, std::size_t{200_KiB}, std::size_t{5000}, std::size_t{250_KiB}}) {
    live.emplace_back(pool.allocate(n), n);
    pool.check_invariants();
  }
  ASSERT_EQ(pool.regions().size(), 1u);
  EXPECT_EQ(pool.regions()[0].bytes, 1_MiB + 4096);
  pool.deallocate(live[1].first, live[1].second);
  pool.check_invariants();
  for (auto [p, n] : live)
    if (p != live[1].first) pool.deallocate(p, n);
  pool.check_invariants();
  EXPECT_EQ(pool.largest_free_block(), 1_MiB + 4096);

  pinned_host_pool small(*dev, {.capacity = 0, .region_size = 1_MiB + 1, .alignment = 256});
  EXPECT_EQ(small.options().region_size, 1_MiB + 4096) << "rounded to the alignment, not to the page";
}

// With an alignment above the page size the region's mapping has room to align its base: a block
// that fills the whole region lies inside pinned memory and every byte of it can be written.
// Pinned spacers of 2 MiB between the regions put some mappings off a 4 MiB boundary.
TEST(PinnedHostPool, ABlockFillingARegionOfLargeAlignmentLiesInsideItsMapping) {
  cpu_device dev(cpu_options());
  owned_stream s(dev);
  void* d = dev.allocate(4_MiB);
  char one = 1;
  dev.copy_async(d, &one, 1, copy_kind::host_to_device, s);  // the stream's thread is up before the mappings
  dev.synchronize_stream(s);
  constexpr int regions = 8;
  std::vector<void*> spacers;
  {
    pinned_host_pool pool(dev, {.capacity = 0, .region_size = 4_MiB, .alignment = 4_MiB});
    std::vector<char*> ps;
    for (int i = 0; i < regions; ++i) {
      ps.push_back(static_cast<char*>(pool.allocate(4_MiB)));
      spacers.push_back(dev.allocate_pinned(2_MiB));
    }
    for (int i = 0; i < regions; ++i) {
      char* p = ps[i];
      EXPECT_EQ(addr(p) % (4_MiB), 0u);
      // The device copies from pinned memory asynchronously; from anything else it waits.
      const auto before = dev.counters().synchronous_copies;
      dev.copy_async(d, p, 4_MiB, copy_kind::host_to_device, s);
      dev.synchronize_stream(s);
      ASSERT_EQ(dev.counters().synchronous_copies, before) << "block " << i << " runs past its mapping";
      std::memset(p, i + 1, 4_MiB);
    }
    EXPECT_EQ(pool.stats().regions, std::uint64_t{regions});
    pool.check_invariants();
    for (void* p : ps) pool.deallocate(p, 4_MiB);
    EXPECT_EQ(pool.release_unused(), regions * 4_MiB);
  }
  for (void* sp : spacers) dev.deallocate_pinned(sp, 2_MiB);
  dev.deallocate(d, 4_MiB);
}

TEST(PinnedHostPool, TheFirstByteAfterARegionIsInNoRegion) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 1_MiB});
  void* p = pool.allocate(4096);
  const auto rs = pool.regions();
  ASSERT_EQ(rs.size(), 1u);
  auto* base = static_cast<char*>(rs[0].base);
  EXPECT_EQ(pool.region_index(base), 0);
  EXPECT_EQ(pool.region_index(base + rs[0].bytes - 1), 0);
  EXPECT_EQ(pool.region_index(base + rs[0].bytes), -1);
  EXPECT_EQ(pool.region_index(base - 1), -1);
  pool.deallocate(p, 4096);
}

// The peaks keep the highest value seen: a free, release_unused() and a smaller region later do
// not lower them.
TEST(PinnedHostPool, PeaksSurviveFreesAndReleasingRegions) {
  auto dev = cpu();
  pinned_host_pool pool(*dev, {.capacity = 0, .region_size = 1_MiB});
  void* big = pool.allocate(3_MiB);  // a region of its own
  void* small = pool.allocate(4096);  // and a 1 MiB region
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 3_MiB + 4096);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 4_MiB);
  pool.deallocate(big, 3_MiB);
  pool.deallocate(small, 4096);
  EXPECT_EQ(pool.release_unused(), 4_MiB);
  auto s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.peak_allocated_bytes, 3_MiB + 4096);
  EXPECT_EQ(s.peak_reserved_bytes, 4_MiB);
  void* again = pool.allocate(8192);  // a new, smaller region
  s = pool.stats();
  EXPECT_EQ(s.reserved_bytes, 1_MiB);
  EXPECT_EQ(s.peak_allocated_bytes, 3_MiB + 4096) << "a smaller allocation lowered the peak";
  EXPECT_EQ(s.peak_reserved_bytes, 4_MiB) << "a smaller region lowered the peak";
  pool.deallocate(again, 8192);
  pool.check_invariants();
}

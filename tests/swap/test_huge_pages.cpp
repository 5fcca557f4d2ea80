// Huge pages for I/O buffers: the 2 MiB-aligned interior is marked, contents never change,
// and bad input is a no-op; huge_page_backed_bytes finds huge pages where they are and none
// where they are not.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>

#include "device/units.hpp"
#include "device/huge_pages.hpp"
#include "swap_test_support.hpp"

using namespace spillway;
using namespace spillway::literals;

namespace {

struct mapping {
  explicit mapping(std::size_t n) : bytes(n) {
    p = static_cast<unsigned char*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~mapping() {
    if (p != MAP_FAILED) ::munmap(p, bytes);
  }
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  unsigned char* p;
  std::size_t bytes;
};

}  // namespace

TEST(HugePages, MarksTheAlignedInteriorAndKeepsContents) {
  mapping m(12_MiB);
  ASSERT_NE(m.p, MAP_FAILED);
  // Start 4 KiB past a 2 MiB boundary so both ends are ragged.
  const auto base = (reinterpret_cast<std::uintptr_t>(m.p) + 2_MiB - 1) & ~std::uintptr_t{2_MiB - 1};
  auto* start = reinterpret_cast<unsigned char*>(base) + 4096;
  const std::size_t n = 8_MiB;
  const auto data = test::random_bytes(n, 77);
  std::memcpy(start, data.data(), n);
  const auto r = detail::back_with_huge_pages(start, n);
  // [start, start + n) holds exactly three whole 2 MiB pages: base+2, base+4, base+6 MiB.
  EXPECT_EQ(r.advised, 6_MiB);
  EXPECT_LE(r.collapsed, r.advised);
  EXPECT_EQ(r.collapsed % 2_MiB, 0u);
  EXPECT_EQ(std::memcmp(start, data.data(), n), 0);
  EXPECT_EQ(m.p[0], 0);  // outside the range: untouched
  EXPECT_GE(detail::huge_page_backed_bytes(start, n), r.collapsed) << "what was collapsed is huge now";
}

TEST(HugePages, SmallOrNullBuffersAreLeftAlone) {
  mapping m(4_MiB);
  ASSERT_NE(m.p, MAP_FAILED);
  std::memset(m.p, 0x3C, 1_MiB);
  const auto r = detail::back_with_huge_pages(m.p, 1_MiB);  // no whole 2 MiB page inside
  EXPECT_EQ(r.advised, 0u);
  EXPECT_EQ(r.collapsed, 0u);
  EXPECT_EQ(m.p[1_MiB - 1], 0x3C);
  EXPECT_EQ(detail::back_with_huge_pages(nullptr, 8_MiB).advised, 0u);
}

namespace {

// The 2 MiB-aligned start of a mapping with at least `n` bytes after it.
unsigned char* aligned_inside(const mapping& m) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(m.p) + 2_MiB - 1) &
                                          ~std::uintptr_t{2_MiB - 1});
}

}  // namespace

// Not backed: pages never touched, and touched pages of a mapping that refuses huge pages.
TEST(HugePages, MeasuresNoneWhereThePagesAreSmallOrAbsent) {
  mapping m(10_MiB);
  ASSERT_NE(m.p, MAP_FAILED);
  auto* start = aligned_inside(m);
  const std::size_t n = 8_MiB;
  EXPECT_EQ(detail::huge_page_backed_bytes(start, n), 0u) << "nothing faulted in yet";
  ASSERT_EQ(::madvise(start, n, MADV_NOHUGEPAGE), 0);
  std::memset(start, 0x5A, n);
  EXPECT_EQ(detail::huge_page_backed_bytes(start, n), 0u);
  EXPECT_EQ(detail::huge_page_backed_bytes_from_smaps(start, n), 0u);
  EXPECT_EQ(detail::huge_page_backed_bytes(nullptr, n), 0u);
  EXPECT_EQ(detail::huge_page_backed_bytes(start, 0), 0u);
}

// Backed: fresh memory marked before its first touch, as allocate_pinned does, comes as huge
// pages when touched. Both methods see them, never more than the range, and a range that
// covers part of a huge page counts that part only (the smaps estimate may count more).
TEST(HugePages, MeasuresHugePagesWhereFreshMemoryWasMarkedBeforeItsFirstTouch) {
  if (!detail::transparent_huge_pages_enabled())
    GTEST_SKIP() << "transparent huge pages are off here (/sys/kernel/mm/transparent_hugepage/enabled)";
  mapping m(10_MiB);
  ASSERT_NE(m.p, MAP_FAILED);
  auto* start = aligned_inside(m);
  const std::size_t n = 8_MiB;
  const auto r = detail::back_with_huge_pages(start, n);
  EXPECT_EQ(r.advised, n);
  EXPECT_EQ(r.collapsed, 0u) << "fresh memory: nothing to collapse";
  EXPECT_EQ(detail::huge_page_backed_bytes(start, n), 0u) << "advice alone backs nothing";
  std::memset(start, 0xA5, n);
  const std::size_t backed = detail::huge_page_backed_bytes(start, n);
  EXPECT_GT(backed, 0u) << "no huge page came: memory too fragmented?";
  EXPECT_LE(backed, n);
  EXPECT_EQ(backed % 2_MiB, 0u);
  const std::size_t estimate = detail::huge_page_backed_bytes_from_smaps(start, n);
  EXPECT_GE(estimate, backed);
  EXPECT_LE(estimate, n);
  // Half of the first 2 MiB page and half of the next: 1 MiB + 1 MiB where both are huge.
  const std::size_t first = detail::huge_page_backed_bytes(start, 2_MiB);
  const std::size_t second = detail::huge_page_backed_bytes(start + 2_MiB, 2_MiB);
  EXPECT_EQ(detail::huge_page_backed_bytes(start + 1_MiB, 2_MiB), first / 2 + second / 2);
  EXPECT_LE(detail::huge_page_backed_bytes(start + 1_MiB, 2_MiB), 2_MiB);
}

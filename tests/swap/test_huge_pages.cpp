// Huge pages for I/O buffers: the 2 MiB-aligned interior is marked, contents never change,
// and bad input is a no-op.
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

// CRC32C against published check values (RFC 3720 appendix B.4, the "123456789" check), and
// the hardware and table versions against each other on random data, offsets and lengths.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "swap/crc32c.hpp"
#include "swap_test_support.hpp"
#include "../test_seed.hpp"

using namespace spillway;

namespace {
struct impl {
  const char* name;
  std::uint32_t (*fn)(const void*, std::size_t, std::uint32_t);
};
std::vector<impl> impls() {
  std::vector<impl> v{{"table", &detail::crc32c_table}};
  if (detail::crc32c_hardware_available()) v.push_back({"sse4.2", &detail::crc32c_sse42});
  v.push_back({"dispatch", [](const void* d, std::size_t n, std::uint32_t c) { return crc32c(d, n, c); }});
  return v;
}
}  // namespace

TEST(Crc32c, CheckValue123456789) {
  for (const auto& i : impls()) EXPECT_EQ(i.fn("123456789", 9, 0), 0xE3069283u) << i.name;
}

TEST(Crc32c, Rfc3720TestVectors) {
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), inc(32), dec(32);
  std::iota(inc.begin(), inc.end(), 0);
  for (int k = 0; k < 32; ++k) dec[k] = static_cast<unsigned char>(31 - k);
  for (const auto& i : impls()) {
    EXPECT_EQ(i.fn(zeros.data(), 32, 0), 0x8A9136AAu) << i.name;
    EXPECT_EQ(i.fn(ones.data(), 32, 0), 0x62A8AB43u) << i.name;
    EXPECT_EQ(i.fn(inc.data(), 32, 0), 0x46DD794Eu) << i.name;
    EXPECT_EQ(i.fn(dec.data(), 32, 0), 0x113FDB5Cu) << i.name;
  }
}

TEST(Crc32c, EmptyInputLeavesTheCrcAlone) {
  for (const auto& i : impls()) {
    EXPECT_EQ(i.fn("", 0, 0), 0u) << i.name;
    EXPECT_EQ(i.fn("", 0, 0x1234u), 0x1234u) << i.name;
  }
}

TEST(Crc32c, ChainingEqualsOneCallOverTheWhole) {
  const auto data = test::random_bytes(10000, 7);
  const std::uint32_t whole = crc32c(data.data(), data.size());
  for (std::size_t cut : {0u, 1u, 7u, 8u, 4095u, 9999u, 10000u})
    EXPECT_EQ(crc32c(data.data() + cut, data.size() - cut, crc32c(data.data(), cut)), whole) << cut;
}

TEST(Crc32c, HardwareAndTableAgreeOnRandomOffsetsAndLengths) {
  if (!detail::crc32c_hardware_available()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  const auto data = test::random_bytes(1 << 16, 11);
  std::mt19937 rng(spillway::test::test_seed(3));
  for (int k = 0; k < 500; ++k) {
    const std::size_t off = rng() % 64;
    const std::size_t len = rng() % (data.size() - off);
    const std::uint32_t seed = rng();
    ASSERT_EQ(detail::crc32c_sse42(data.data() + off, len, seed), detail::crc32c_table(data.data() + off, len, seed))
        << "offset " << off << " length " << len;
  }
}

TEST(Crc32c, DetectsEverySingleBitFlipInABlock) {
  auto data = test::random_bytes(4096, 5);
  const std::uint32_t good = crc32c(data.data(), data.size());
  for (std::size_t bit = 0; bit < data.size() * 8; bit += 97) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(crc32c(data.data(), data.size()), good) << bit;
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

TEST(Crc32c, LongInputsTakeTheInterleavedPathAndStillAgree) {
  const auto data = test::random_bytes((3u << 20) + 64, 13);
  for (std::size_t len : {std::size_t{1535}, std::size_t{1536}, std::size_t{1537}, std::size_t{786432},
                          std::size_t{786432 * 2 + 13}, std::size_t{3u << 20}}) {
    for (std::size_t off : {0u, 3u}) {
      const std::uint32_t want = detail::crc32c_table(data.data() + off, len, 0x9E3779B9u);
      EXPECT_EQ(crc32c(data.data() + off, len, 0x9E3779B9u), want) << "offset " << off << " length " << len;
    }
  }
}

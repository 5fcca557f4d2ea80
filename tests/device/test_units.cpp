// Size parsing: plain bytes and units are accepted; bad input is refused, quoting what was given.
#include <gtest/gtest.h>

#include <random>

#include "device/error.hpp"
#include "device/units.hpp"
#include "../test_seed.hpp"

using namespace spillway;
using namespace spillway::literals;

TEST(Units, AcceptsPlainBytesAndUnits) {
  EXPECT_EQ(parse_size("1048576"), 1_MiB);
  EXPECT_EQ(parse_size("512MiB"), 512_MiB);
  EXPECT_EQ(parse_size("6GiB"), 6_GiB);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000ULL);
  EXPECT_EQ(parse_size("1.5 GiB"), 3 * 512_MiB);
  EXPECT_EQ(parse_size("64kib"), 64_KiB);
  EXPECT_EQ(parse_size("  4096B "), 4096ULL);
  EXPECT_EQ(parse_size("2TB"), 2000000000000ULL);
  EXPECT_EQ(parse_size("0", "x", /*allow_zero=*/true), 0ULL);
}

TEST(Units, RefusesBadInputQuotingIt) {
  for (const char* bad : {"12XB", "-3GiB", "", "GiB", "0", "0MiB", "1.5", "1e3", "nan", "2PiB", "99999999TB", "1.2.3GiB"}) {
    try {
      (void)parse_size(bad, "--device-budget");
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const config_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("\"") + bad + "\""), std::string::npos) << msg;
      EXPECT_NE(msg.find("--device-budget"), std::string::npos) << msg;
    }
  }
}

// A fraction of a byte written with more decimals than 128 bits hold (a fuzzer's input) is
// refused like any other fraction, and a whole number written with many zero decimals is not.
TEST(Units, ManyDecimalsStillParseExactly) {
  EXPECT_THROW((void)parse_size("0." + std::string(128, '0') + "1135789828K"), config_error);
  EXPECT_EQ(parse_size("2." + std::string(60, '0') + "KiB"), 2_KiB);
}

TEST(Units, FormatThenParseRoundTripsWholeUnits) {
  std::mt19937_64 rng(spillway::test::test_seed(7));
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t mib = rng() % 100000 + 1;
    EXPECT_EQ(parse_size(std::to_string(mib) + "MiB"), mib << 20);
    EXPECT_EQ(parse_size(std::to_string(mib << 20)), mib << 20);
  }
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(3 * 512_MiB), "1.50 GiB");
}

TEST(Units, RealsAreWrittenAsGiven) {
  EXPECT_EQ(format_real(0), "0");
  EXPECT_EQ(format_real(0.25), "0.25");
  EXPECT_EQ(format_real(-1.5), "-1.5");
  EXPECT_EQ(format_real(132537.900648), "132538");
  EXPECT_EQ(format_real(1e6), "1e+06");
}

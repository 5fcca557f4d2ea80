// Size parsing: plain bytes and units are accepted; bad input is refused, quoting what was given.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "device/error.hpp"
#include "device/units.hpp"
#include "../budget_hint.hpp"
#include "../comma_locale.hpp"
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

TEST(Units, AtLeastRoundsUpAndGivesTheBytesWhereItRounded) {
  EXPECT_EQ(format_bytes_at_least(17), "17 B");
  EXPECT_EQ(format_bytes_at_least(8_MiB), "8.00 MiB");
  EXPECT_EQ(format_bytes_at_least(3 * 512_MiB), "1.50 GiB");
  // 11 MiB and 1 KiB: format_bytes writes "11.00 MiB", which is not enough.
  EXPECT_EQ(format_bytes(11_MiB + 1_KiB), "11.00 MiB");
  EXPECT_EQ(format_bytes_at_least(11_MiB + 1_KiB), "11.01 MiB (11535360 bytes)");
  EXPECT_EQ(format_bytes_at_least(1_GiB - 1), "1024.00 MiB (1073741823 bytes)");
}

// Whatever the size, the value shown is at least the size and less than a hundredth of its
// unit above it, and what the message asks for parses back to the size: the byte count where
// one is given, else the value, which is then exact.
TEST(Units, AtLeastIsNeverBelowTheSizeProperty) {
  std::mt19937_64 rng(spillway::test::test_seed(11));
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t bytes = rng() % (std::uint64_t{1} << (1 + rng() % 49)) + 1;  // up to 512 TiB
    const std::string s = format_bytes_at_least(bytes);
    const auto hint = spillway::test::read_at_least(s);
    const std::string& shown = hint.shown;
    const auto sp = shown.find(' ');
    const double value = std::stod(shown.substr(0, sp));
    const std::string unit = shown.substr(sp + 1);
    const double factor = unit == "B" ? 1 : unit == "KiB" ? 0x1p10 : unit == "MiB" ? 0x1p20 : unit == "GiB" ? 0x1p30 : 0x1p40;
    const double shown_bytes = value * factor;
    ASSERT_GE(shown_bytes * (1 + 1e-12), static_cast<double>(bytes)) << s;
    ASSERT_LT(shown_bytes, static_cast<double>(bytes) + 0.01 * factor + 1) << s;
    if (!hint.bytes) {
      ASSERT_EQ(shown, format_bytes(bytes));  // exact at two decimals: as format_bytes writes it
    }
    ASSERT_EQ(hint.size(), bytes) << s;
  }
}

TEST(Units, RealsAreWrittenAsGiven) {
  EXPECT_EQ(format_real(0), "0");
  EXPECT_EQ(format_real(0.25), "0.25");
  EXPECT_EQ(format_real(-1.5), "-1.5");
  EXPECT_EQ(format_real(132537.900648), "132538");
  EXPECT_EQ(format_real(1e6), "1e+06");
}

// A program may set a locale whose decimal point is a comma (setlocale(LC_ALL, "") under
// LANG=de_DE.UTF-8). What the library writes must read the same, and read back: a budget hint
// that said "1,50 GiB" would be refused by parse_size when the user pasted it into a setting.
TEST(Units, SizesAndRealsAreWrittenTheSameInACommaDecimalLocale) {
  test::comma_numeric_locale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why_not();
  char printf_wrote[16];
  std::snprintf(printf_wrote, sizeof printf_wrote, "%.2f", 1.5);
  ASSERT_STREQ(printf_wrote, "1,50") << "the locale is set: printf now writes a comma";
  EXPECT_EQ(format_bytes(3 * (1_GiB / 2)), "1.50 GiB");
  EXPECT_EQ(parse_size(format_bytes(3 * (1_GiB / 2))), 3 * (1_GiB / 2));
  EXPECT_EQ(format_bytes_at_least(1_GiB + 1), "1.01 GiB (1073741825 bytes)");
  EXPECT_EQ(format_real(0.25), "0.25");
  EXPECT_EQ(format_real(1e6), "1e+06");
  EXPECT_EQ(format_number(2.25, std::chars_format::fixed, 1), "2.2");
  EXPECT_EQ(parse_size("1.5GiB"), 3 * (1_GiB / 2));
}

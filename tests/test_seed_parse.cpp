// tests/test_seed.hpp: SPILLWAY_TEST_SEED is read as a plain unsigned number or refused.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "test_seed.hpp"

using spillway::test::parse_test_seed;

TEST(TestSeed, UnsetOrEmptyIsZero) {
  EXPECT_EQ(parse_test_seed(nullptr), 0u);
  EXPECT_EQ(parse_test_seed(""), 0u);
}

TEST(TestSeed, ReadsADecimalNumber) {
  EXPECT_EQ(parse_test_seed("0"), 0u);
  EXPECT_EQ(parse_test_seed("17"), 17u);
  EXPECT_EQ(parse_test_seed("18446744073709551615"), 18446744073709551615ull);
}

TEST(TestSeed, RefusesWhatIsNotOne) {
  for (const char* bad : {"-1", "+3", " 7", "7 ", "0x10", "1e3", "seven", "18446744073709551616"}) {
    try {
      (void)parse_test_seed(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("unsigned decimal number"), std::string::npos) << what;
    }
  }
}

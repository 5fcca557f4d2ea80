// Seeds of the randomized property tests. Each test fixes its own seed, so a run repeats
// exactly; the environment variable SPILLWAY_TEST_SEED, an unsigned number (0 when unset), is
// added to every one of them, so that scripts/soak can run the same properties over fresh
// cases and name the seed of any case that fails.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace spillway::test {

/// SPILLWAY_TEST_SEED's value `text` (null: unset) as a number; std::invalid_argument, saying
/// what was given and what is expected, for anything but a plain unsigned decimal number.
inline std::uint64_t parse_test_seed(const char* text) {
  if (text == nullptr || *text == '\0') return 0;
  const std::string s(text);
  const bool digits = s.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = digits ? std::strtoull(text, &end, 10) : 0;
  if (!digits || errno == ERANGE || end == nullptr || *end != '\0')
    throw std::invalid_argument("SPILLWAY_TEST_SEED is '" + s +
                                "': expected an unsigned decimal number below 2^64 (0 or unset: the tests' own seeds)");
  return v;
}

/// The seed a test uses where its own is `base`: base + SPILLWAY_TEST_SEED (wrapping).
inline std::uint64_t test_seed(std::uint64_t base) { return base + parse_test_seed(std::getenv("SPILLWAY_TEST_SEED")); }

}  // namespace spillway::test

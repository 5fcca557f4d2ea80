// What parse_size must return for a text, worked out by another route (the digits as an exact
// fraction): shared by the GoogleTest fuzz driver (test_fuzz.cpp) and the libFuzzer targets.
#pragma once

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "device/units.hpp"

namespace spillway::fuzz {

/// What parse_size must return for `text`, worked out by a different route (the digits as a
/// fraction, reduced), or nullopt where it must refuse. Inputs whose numbers are too long to
/// work out here give `unknown` and are only checked for range.
struct expected_size {
  bool unknown = false;
  std::optional<std::uint64_t> bytes;
};

inline expected_size reference_size(const std::string& text) {
  std::string s = text;
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && space(s.front())) s.erase(s.begin());
  while (!s.empty() && space(s.back())) s.pop_back();
  if (!s.empty() && s.front() == '+') s.erase(s.begin());
  std::size_t i = 0;
  std::string digits;
  int decimals = 0;
  bool seen_digit = false;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') digits += s[i++], seen_digit = true;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') digits += s[i++], ++decimals, seen_digit = true;
  }
  if (!seen_digit) return {};
  while (i < s.size() && s[i] == ' ') ++i;
  std::string unit = s.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::pair<const char*, long double> units[] = {
      {"", 1},      {"b", 1},     {"kib", 1024.0L}, {"mib", 1048576.0L}, {"gib", 1073741824.0L},
      {"tib", 1099511627776.0L}, {"kb", 1e3L}, {"mb", 1e6L}, {"gb", 1e9L}, {"tb", 1e12L},
      {"k", 1024.0L}, {"m", 1048576.0L}, {"g", 1073741824.0L}, {"t", 1099511627776.0L}};
  long double factor = -1;
  for (const auto& [n, f] : units)
    if (unit == n) factor = f;
  if (factor < 0) return {};
  while (!digits.empty() && digits.front() == '0') digits.erase(digits.begin());
  while (decimals > 0 && !digits.empty() && digits.back() == '0') digits.pop_back(), --decimals;
  if (digits.size() > 18) return {.unknown = true, .bytes = std::nullopt};
  // Past 36 decimals 10^decimals does not fit the 128-bit denominator; the value is then below
  // one byte (the numerator stays under 10^18 x 2^40 < 10^31), so it is refused.
  if (decimals > 36) return {};
  // value = digits x factor / 10^decimals, exactly: factor is 2^a or 10^b, both exact here.
  unsigned __int128 num = 0;
  for (char c : digits) num = num * 10 + static_cast<unsigned>(c - '0');
  num *= static_cast<unsigned __int128>(factor);
  unsigned __int128 den = 1;
  for (int d = 0; d < decimals; ++d) den *= 10;
  if (num % den != 0) return {};
  const auto bytes = num / den;
  if (bytes == 0 || bytes > max_size_bytes) return {};
  return {.bytes = static_cast<std::uint64_t>(bytes)};
}

}  // namespace spillway::fuzz

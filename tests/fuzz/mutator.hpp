// A small structure-aware mutator for the parser fuzz tests: byte flips, inserts, deletes,
// splices between corpus entries, and, because the inputs are JSON and sizes, replacement of a
// number or a string with one of a list of values that break careless parsers (2^63, NaN, -1,
// 4.1GB, empty strings, ...). Deterministic for a seed, so a failure reproduces.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spillway::fuzz {

class mutator {
 public:
  explicit mutator(std::uint64_t seed) : rng_(seed) {}

  /// A mutant of one of `corpus`'s entries (1 to 4 mutations stacked).
  std::string next(std::span<const std::string> corpus) {
    std::string s = corpus[pick(corpus.size())];
    const int rounds = 1 + static_cast<int>(pick(4));
    for (int i = 0; i < rounds; ++i) mutate(s, corpus);
    return s;
  }

 private:
  std::size_t pick(std::size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  static bool is_number_char(char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E';
  }

  void mutate(std::string& s, std::span<const std::string> corpus) {
    static constexpr std::string_view numbers[] = {
        "0", "-1", "1", "0.5", "1e308", "-1e308", "1e-320", "nan", "NaN", "inf", "-0",
        "4294967295", "4294967296", "4294971392", "9223372036854775807", "9223372036854775808",
        "18446744073709551615", "18446744073709551616", "1125899906842624", "1125899906842625",
        "4.1", "16.1", "8.2", "3.999999999999999999", "1e19", "2147483648", "99999999999999999999999"};
    static constexpr std::string_view strings[] = {
        "\"\"", "\"4.1GB\"", "\"16.1KB\"", "\"1PiB\"", "\"1.0000000001GiB\"", "\"-5\"", "\"nan\"",
        "\"inf\"", "\"0\"", "\"18446744073709551616\"", "\"1e3\"", "\" \"", "\"\\u0000\"", "null",
        "[]", "{}", "true", "\"a\"", "\"x\"", "\"parameter\"", "\"activation\"", "\"forward\""};
    const std::size_t n = s.size();
    switch (pick(9)) {
      case 0:  // flip a bit
        if (n > 0) s[pick(n)] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:  // insert a byte
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(pick(n + 1)), static_cast<char>(pick(256)));
        break;
      case 2:  // delete a range
        if (n > 0) {
          const std::size_t at = pick(n);
          s.erase(at, 1 + pick(std::min<std::size_t>(16, n - at)));
        }
        break;
      case 3:  // duplicate a range
        if (n > 0) {
          const std::size_t at = pick(n);
          const std::size_t len = 1 + pick(std::min<std::size_t>(64, n - at));
          s.insert(pick(n + 1), s.substr(at, len));
        }
        break;
      case 4: {  // splice: head of this one, tail of another
        const std::string& other = corpus[pick(corpus.size())];
        s = s.substr(0, pick(n + 1)) + other.substr(pick(other.size() + 1));
        break;
      }
      case 5:
      case 6: {  // replace a number with an interesting one
        std::vector<std::size_t> starts;
        for (std::size_t i = 0; i < n; ++i)
          if (s[i] >= '0' && s[i] <= '9' && (i == 0 || !is_number_char(s[i - 1]))) starts.push_back(i);
        if (starts.empty()) break;
        std::size_t a = starts[pick(starts.size())], b = a;
        while (b < n && is_number_char(s[b])) ++b;
        if (a > 0 && s[a - 1] == '-') --a;
        s.replace(a, b - a, numbers[pick(std::size(numbers))]);
        break;
      }
      case 7: {  // replace a JSON string (or any value after a colon) with an interesting one
        std::vector<std::size_t> quotes;
        for (std::size_t i = 0; i < n; ++i)
          if (s[i] == '"') quotes.push_back(i);
        if (quotes.size() < 2) break;
        const std::size_t q = pick(quotes.size() / 2) * 2;
        s.replace(quotes[q], quotes[q + 1] - quotes[q] + 1, strings[pick(std::size(strings))]);
        break;
      }
      default:  // truncate
        s.resize(pick(n + 1));
        break;
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace spillway::fuzz

// Size parsing and formatting.
// Parsing reads the decimal digits exactly (no binary floating point, no locale), so "4.1GB" is 4100000000.
// Formatting writes with std::to_chars, which the C locale does not touch: a program that sets a
// locale whose decimal point is a comma still reads "1.50 GiB", which parse_size takes back.
#include "device/units.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

#include "device/error.hpp"

namespace spillway {
namespace {

struct unit {
  const char* name;
  std::uint64_t factor;
};

constexpr unit units[] = {
    {"", 1},           {"b", 1},
    {"kib", 1ULL << 10}, {"mib", 1ULL << 20}, {"gib", 1ULL << 30}, {"tib", 1ULL << 40},
    {"kb", 1000ULL},   {"mb", 1000000ULL},  {"gb", 1000000000ULL}, {"tb", 1000000000000ULL},
    {"k", 1ULL << 10}, {"m", 1ULL << 20},   {"g", 1ULL << 30},     {"t", 1ULL << 40},
};

[[noreturn]] void bad(std::string_view text, std::string_view what, const std::string& why) {
  throw config_error(std::string(what) + ": cannot use \"" + std::string(text) + "\": " + why +
                     "; write a byte count such as 1048576 or a size such as 512MiB, 6GiB, 1.5GB");
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

// The number is read as decimal digits, exactly: "4.1GB" is 41 x 10^8 bytes, with no binary
// floating point in between to make it 4099999999.9999995 and refuse it as fractional.
std::uint64_t parse_size(std::string_view text, std::string_view what, bool allow_zero) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) bad(text, what, "it is empty");
  if (s.front() == '-') bad(text, what, "a size cannot be negative");
  if (s.front() == '+') s.remove_prefix(1);

  std::size_t i = 0;
  std::string_view whole, fraction;
  while (i < s.size() && is_digit(s[i])) ++i;
  whole = s.substr(0, i);
  if (i < s.size() && s[i] == '.') {
    const std::size_t from = ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
    fraction = s.substr(from, i - from);
  }
  if (whole.empty() && fraction.empty()) bad(text, what, "it does not start with a number");

  std::string_view rest = s.substr(i);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::string suffix(rest);
  std::transform(suffix.begin(), suffix.end(), suffix.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const unit* found = nullptr;
  for (const auto& u : units)
    if (suffix == u.name) found = &u;
  if (found == nullptr) bad(text, what, "unknown unit \"" + std::string(rest) + "\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");

  using wide = unsigned __int128;
  const wide limit = max_size_bytes;
  while (!whole.empty() && whole.front() == '0') whole.remove_prefix(1);
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (whole.size() > 16) bad(text, what, "it is larger than the 1 PiB Spillway accepts");
  wide units_whole = 0;
  for (char c : whole) units_whole = units_whole * 10 + static_cast<unsigned>(c - '0');
  if (units_whole * found->factor > limit) bad(text, what, "it is larger than the 1 PiB Spillway accepts");
  // A unit is at most 10^12 or 2^40, so a fraction with more than 12 significant digits can
  // never make whole bytes.
  if (fraction.size() > 12) bad(text, what, "it is not a whole number of bytes");
  wide scale = 1, digits = units_whole;
  for (char c : fraction) {
    scale *= 10;
    digits = digits * 10 + static_cast<unsigned>(c - '0');
  }
  const wide scaled = digits * found->factor;
  if (scaled % scale != 0) bad(text, what, "it is not a whole number of bytes");
  const wide bytes = scaled / scale;
  if (bytes > limit) bad(text, what, "it is larger than the 1 PiB Spillway accepts");
  if (bytes == 0 && !allow_zero) bad(text, what, "a size must be greater than zero");
  return static_cast<std::uint64_t>(bytes);
}

std::string format_real(double v) { return format_number(v, std::chars_format::general, 6); }

std::string format_number(double v, std::chars_format how, int precision) {
  char buf[128];
  auto r = std::to_chars(buf, buf + sizeof buf, v, how, precision);
  if (r.ec != std::errc{}) r = std::to_chars(buf, buf + sizeof buf, v);  // too long in `how`: the shortest form
  return std::string(buf, r.ptr);
}

namespace {
constexpr const char* unit_names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};

// The unit format_bytes writes `bytes` in (an index of unit_names) and the value in it.
int unit_of(std::uint64_t bytes, double* v) {
  *v = static_cast<double>(bytes);
  int i = 0;
  while (*v >= 1024.0 && i < 5) {
    *v /= 1024.0;
    ++i;
  }
  return i;
}
}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = 0;
  const int i = unit_of(bytes, &v);
  return format_number(v, std::chars_format::fixed, 2) + " " + unit_names[i];
}

std::string format_bytes_at_least(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = 0;
  const int i = unit_of(bytes, &v);
  // Hundredths of the unit, rounded up, in exact integers: the shown value is at least `bytes`.
  const auto unit = static_cast<unsigned __int128>(1) << (10 * i);
  const unsigned __int128 hundredths = (static_cast<unsigned __int128>(bytes) * 100 + unit - 1) / unit;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llu.%02llu %s", static_cast<unsigned long long>(hundredths / 100),
                static_cast<unsigned long long>(hundredths % 100), unit_names[i]);
  std::string out = buf;
  if (hundredths * unit != static_cast<unsigned __int128>(bytes) * 100) out += " (" + std::to_string(bytes) + " bytes)";
  return out;
}

}  // namespace spillway

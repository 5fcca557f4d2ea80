// Size parsing and formatting.
// Parsing goes through std::from_chars so no locale can change the meaning of "1.5".
#include "device/units.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "device/error.hpp"

namespace spillway {
namespace {

struct unit {
  const char* name;
  double factor;
};

constexpr unit units[] = {
    {"", 1.0},          {"b", 1.0},
    {"kib", 1024.0},    {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
    {"kb", 1e3},        {"mb", 1e6},        {"gb", 1e9},           {"tb", 1e12},
    {"k", 1024.0},      {"m", 1048576.0},   {"g", 1073741824.0},   {"t", 1099511627776.0},
};

[[noreturn]] void bad(std::string_view text, std::string_view what, const std::string& why) {
  throw config_error(std::string(what) + ": cannot use \"" + std::string(text) + "\": " + why +
                     "; write a byte count such as 1048576 or a size such as 512MiB, 6GiB, 1.5GB");
}

}  // namespace

std::uint64_t parse_size(std::string_view text, std::string_view what, bool allow_zero) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) bad(text, what, "it is empty");
  if (s.front() == '-') bad(text, what, "a size cannot be negative");
  if (s.front() == '+') s.remove_prefix(1);

  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value, std::chars_format::fixed);
  if (ec != std::errc() || end == s.data()) bad(text, what, "it does not start with a number");
  if (!std::isfinite(value)) bad(text, what, "the number is not finite");

  std::string_view rest(end, static_cast<std::size_t>(s.data() + s.size() - end));
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::string suffix(rest);
  std::transform(suffix.begin(), suffix.end(), suffix.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });

  const unit* found = nullptr;
  for (const auto& u : units)
    if (suffix == u.name) found = &u;
  if (found == nullptr) bad(text, what, "unknown unit \"" + std::string(rest) + "\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");

  const double bytes = value * found->factor;
  if (bytes > static_cast<double>(max_size_bytes))
    bad(text, what, "it is larger than the 1 PiB Spillway accepts");
  if (std::floor(bytes) != bytes) bad(text, what, "it is not a whole number of bytes");
  if (bytes == 0 && !allow_zero) bad(text, what, "a size must be greater than zero");
  return static_cast<std::uint64_t>(bytes);
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1024.0 && i < 5) {
    v /= 1024.0;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, names[i]);
  return buf;
}

}  // namespace spillway

// Reading back the sizes error messages ask for (format_bytes_at_least in device/units.hpp):
// "11.01 MiB (11535360 bytes)" or, where nothing rounds, "8.00 MiB".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "device/units.hpp"

namespace spillway::test {

struct at_least_size {
  std::string shown;                   ///< "11.01 MiB"
  std::optional<std::uint64_t> bytes;  ///< 11535360, where the message gives the bytes
  /// What to give back: the bytes where given, else the value shown (then exact).
  [[nodiscard]] std::uint64_t size() const { return bytes ? *bytes : parse_size(shown, "hint"); }
};

/// Splits what format_bytes_at_least wrote.
inline at_least_size read_at_least(const std::string& s) {
  const auto open = s.find(" (");
  at_least_size out{s.substr(0, open), std::nullopt};
  if (open != std::string::npos) out.bytes = parse_size(s.substr(open + 2, s.find(" bytes") - open - 2), "hint");
  return out;
}

/// The executor's over-budget hint in `msg` ("... they need X in all ..."); nullopt when absent.
inline std::optional<at_least_size> read_budget_hint(const std::string& msg) {
  const auto from = msg.find("they need ");
  if (from == std::string::npos) return std::nullopt;
  std::string hint = msg.substr(from + 10);
  return read_at_least(hint.substr(0, hint.find(" in all")));
}

}  // namespace spillway::test

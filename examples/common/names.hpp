// Names of per-layer tensors and ops: "h3." + what. Built by appending, which also keeps GCC 12's
// -Wrestrict false positive on `"h" + std::to_string(i)` (an insert at 0) out of release builds.
#pragma once

#include <string>
#include <string_view>

namespace spillway::examples {

/// prefix, the number, a dot: indexed("h", 3) == "h3.".
[[nodiscard]] inline std::string indexed(std::string_view prefix, long long i) {
  std::string s(prefix);
  s += std::to_string(i);
  s += '.';
  return s;
}

}  // namespace spillway::examples

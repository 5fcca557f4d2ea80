// Out-of-line pieces of the error hierarchy: the one location format.
#include "device/error.hpp"

#include <string_view>

namespace spillway::detail {

std::string location_suffix(const char* file, int line) {
  std::string_view f(file);
  while (f.starts_with("../")) f.remove_prefix(3);
  return " [at " + std::string(f) + ":" + std::to_string(line) + "]";
}

}  // namespace spillway::detail

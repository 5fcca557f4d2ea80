// Out-of-line pieces of the error hierarchy.
// Keeps the string building out of every call site of SPILLWAY_EXPECTS.
#include "device/error.hpp"

namespace spillway::detail {

void throw_expects(const char* file, int line, const char* cond, const std::string& msg) {
  throw error(msg + " [check failed: " + cond + " at " + file + ":" + std::to_string(line) + "]");
}

}  // namespace spillway::detail

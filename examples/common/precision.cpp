// Precision names for the --precision flag and reports.
#include "examples/common/precision.hpp"

#include "device/error.hpp"

namespace spillway::examples {

const char* to_string(precision p) noexcept { return p == precision::bf16 ? "bf16" : "fp32"; }

precision parse_precision(const std::string& text) {
  if (text == "fp32") return precision::fp32;
  if (text == "bf16") return precision::bf16;
  throw config_error("--precision: '" + text + "' is not a precision; give fp32 or bf16");
}

}  // namespace spillway::examples

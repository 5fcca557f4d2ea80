// Example options: preset names, validation (the Session's settings by session_config, the
// example's own here) and the session_config a run opens its Session with.
#include "examples/common/options.hpp"

#include <cstdio>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::examples {

const char* to_string(preset p) noexcept {
  switch (p) {
    case preset::tiny: return "tiny";
    case preset::small: return "small";
    case preset::medium: return "medium";
    case preset::large: return "large";
  }
  return "?";
}

preset parse_preset(const std::string& text) {
  if (text == "tiny") return preset::tiny;
  if (text == "small" || text == "default") return preset::small;
  if (text == "medium") return preset::medium;
  if (text == "large") return preset::large;
  throw config_error("--preset: '" + text + "' is not a preset (tiny, small, medium, large)");
}

void example_options::validate() const {
  session_config::validate();
  if (steps < 1) throw config_error("--steps: " + std::to_string(steps) + " is not a positive number of steps");
  if (!(budget_ratio >= 0) || budget_ratio > 1e6)
    throw config_error("--budget-ratio: " + std::to_string(budget_ratio) + " is not a ratio above 0");
  if (budget_ratio > 0 && device_budget > 0)
    throw config_error("--budget-ratio and " + source_of("device_budget") + " both set the device budget; give one");
  if (budget_ratio > 0 && device_budget_ratio > 0)
    throw config_error("--budget-ratio and " + source_of("device_budget_ratio") + " both set the device budget; give one");
}

session_config make_session_config(const example_options& o, std::uint64_t device_budget) {
  session_config c = o;  // the Session's part; chrome_trace: the Session records a timeline only when set
  c.device_budget = device_budget;
  // --budget-ratio is the Session's device_budget_ratio, named by the example's flag in messages.
  // Above 1 (a budget with room beyond the footprint, which the train bench gives the
  // everything-resident run on a GPU) the trainer sets the budget itself.
  if (o.budget_ratio > 0 && o.budget_ratio <= 1) {
    char text[40];
    std::snprintf(text, sizeof text, "%.17g", o.budget_ratio);
    c.set("device_budget_ratio", text, "--budget-ratio");
  }
  return c;
}

}  // namespace spillway::examples

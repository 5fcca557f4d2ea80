// Example options: preset names, validation with messages that quote the bad value, and the
// translation into a session_config.
#include "examples/common/options.hpp"

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
  if (backend != "auto" && backend != "cpu" && backend != "cuda")
    throw config_error("--backend: '" + backend + "' is not a backend (auto, cpu, cuda)");
  if (policy != "none" && policy != "lms" && policy != "vdnn" && policy != "auto")
    throw config_error("--policy: '" + policy + "' is not a policy (none, lms, vdnn, auto)");
  if (steps < 1) throw config_error("--steps: " + std::to_string(steps) + " is not a positive number of steps");
  if (budget_ratio < 0 || budget_ratio > 1e6)
    throw config_error("--budget-ratio: " + std::to_string(budget_ratio) + " is not a ratio above 0");
  if (budget_ratio > 0 && device_budget > 0)
    throw config_error("--budget-ratio and --device-budget both set the device budget; give one");
  if (link_gbps < 0) throw config_error("--link-gbps: " + std::to_string(link_gbps) + " is negative");
}

session_config make_session_config(const example_options& o, std::uint64_t device_budget) {
  session_config c;
  c.device = o.backend;
  c.cpu_device_memory = o.device_memory;
  c.link_gbps = o.link_gbps;
  c.device_budget = device_budget;
  c.host_budget = o.host_budget;
  c.nvme_paths = o.nvme_dirs;
  c.policy = o.policy;
  c.chrome_trace = o.chrome_trace;  // the Session records its timeline only when this is set
  return c;
}

}  // namespace spillway::examples

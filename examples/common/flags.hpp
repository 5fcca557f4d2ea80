// Command-line flags every example program takes (CLI11), kept as text until parsed into
// example_options so that a bad size or name is reported quoting what was given.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "examples/common/options.hpp"

namespace spillway::examples {

struct flag_values {
  std::string backend = "auto";
  std::string device_memory;
  std::string device_budget;
  double budget_ratio = 0;
  std::string host_budget;
  std::vector<std::string> nvme_dirs;
  std::string policy = "auto";
  double link_gbps = 0;
  int steps = 10;
  std::uint64_t seed = 1;
  std::string preset = "small";
  std::string chrome_trace;
  std::string report;
  std::string data;
};

/// Adds --backend, --device-memory, --device-budget, --budget-ratio, --host-budget, --nvme-dir
/// (repeatable), --policy, --link-gbps, --steps, --seed, --preset, --chrome-trace, --report,
/// and --data when `with_data`.
void add_common_flags(CLI::App& app, flag_values& v, bool with_data);

/// Parses sizes and names; config_error quoting the first bad value.
[[nodiscard]] example_options to_options(const flag_values& v);

}  // namespace spillway::examples

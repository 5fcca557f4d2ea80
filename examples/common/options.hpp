// Options every example shares: the session_config (backend, budgets, tiers, policy, ...) and the
// example's own (steps, seed, size preset). Filled by the programs' flags or by tests and bench.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "offload/session_config.hpp"

namespace spillway::examples {

/// Model sizes. tiny: for tests (milliseconds a step); small: the default, about a second a
/// step on the 2-core cpu backend and a footprint inside its default 1 GiB; medium and large:
/// for a GPU.
enum class preset { tiny, small, medium, large };

[[nodiscard]] const char* to_string(preset p) noexcept;
/// Parses "tiny", "small" (also "default"), "medium", "large"; config_error quoting the text.
[[nodiscard]] preset parse_preset(const std::string& text);

/// An example's settings: the Session's own (a session_config, checked by its validate()) and
/// the example's (steps, seed, size, data, a budget as a ratio of the footprint).
struct example_options : session_config {
  double budget_ratio = 0;               ///< > 0: device budget = ratio x footprint
  int steps = 10;
  std::uint64_t seed = 1;
  preset size = preset::small;
  std::string data;                      ///< gpt: text file to train on (empty: generated corpus)

  /// session_config::validate, then the example's own settings; config_error naming the first
  /// bad one (by its flag or variable) and quoting its value.
  void validate() const;
};

/// The session_config for these options with the given device budget (0 = the device's memory).
[[nodiscard]] session_config make_session_config(const example_options& o, std::uint64_t device_budget);

}  // namespace spillway::examples

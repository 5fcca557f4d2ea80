// Options every example shares (backend, budgets, tiers, policy, steps, seed, size preset) and
// how they become a session_config. Filled by the programs' flags or directly by tests and bench.
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

struct example_options {
  std::string backend = "auto";          ///< auto, cpu or cuda
  std::uint64_t device_memory = 0;       ///< cpu backend capacity; 0 = its default
  std::uint64_t device_budget = 0;       ///< 0 = the device's memory (or budget_ratio)
  double budget_ratio = 0;               ///< > 0: device budget = ratio x footprint
  std::uint64_t host_budget = 0;         ///< 0 = no limit on the host tier
  std::vector<std::string> nvme_dirs;    ///< NVMe-tier swap directories
  std::string policy = "auto";           ///< none, lms, vdnn or auto
  double link_gbps = 0;                  ///< cpu backend link GB/s each way; 0 = unlimited
  int steps = 10;
  std::uint64_t seed = 1;
  preset size = preset::small;
  std::string chrome_trace;              ///< write a Chrome trace here at the end
  std::string data;                      ///< gpt: text file to train on (empty: generated corpus)

  /// Throws config_error naming the first option that makes no sense, quoting its value.
  void validate() const;
};

/// The session_config for these options with the given device budget (0 = the device's memory).
[[nodiscard]] session_config make_session_config(const example_options& o, std::uint64_t device_budget);

}  // namespace spillway::examples

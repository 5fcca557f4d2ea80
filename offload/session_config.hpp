// The one config struct of a Session: filled in code, from a small JSON file, or from SPILLWAY_*
// environment variables. Sizes are written as 1048576, 512MiB, 6GiB or 1.5GB.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spillway {

struct session_config {
  // Where to run.
  std::string device = "auto";            ///< "auto", "cpu" or "cuda"            SPILLWAY_DEVICE
  std::uint64_t cpu_device_memory = 0;    ///< cpu backend capacity; 0 = default  SPILLWAY_CPU_DEVICE_MEMORY
  double link_gbps = 0;                   ///< cpu backend link, GB/s each way; 0 = unlimited  SPILLWAY_LINK_GBPS

  // How much of each tier to use.
  std::uint64_t device_budget = 0;        ///< 0 = what is free (GPU: less 1/16) SPILLWAY_DEVICE_BUDGET
  std::uint64_t host_budget = 0;          ///< 0 = no limit on the host tier SPILLWAY_HOST_BUDGET
  std::vector<std::string> nvme_paths;    ///< swap directories; striped     SPILLWAY_NVME_PATHS (comma-separated)
  std::uint64_t nvme_reserve = 0;         ///< swap space reserved up front; 0 = as needed by the plan  SPILLWAY_NVME_RESERVE

  // What to move and when.
  std::string policy = "auto";            ///< none, lms, vdnn or auto        SPILLWAY_POLICY
  // lms knobs; 0 = let the planner tune it (it tries a small grid, as TFLMS users do by hand).
  std::uint64_t lms_swapout_threshold = 0;///< lms: ops a tensor must sit idle before it is swapped out  SPILLWAY_LMS_SWAPOUT_THRESHOLD
  std::uint64_t lms_swapin_ahead = 0;     ///< lms: ops ahead of use to start a swap-in  SPILLWAY_LMS_SWAPIN_AHEAD
  std::uint64_t lms_swapin_groupby = 0;   ///< lms: swap-ins issued together within this many ops  SPILLWAY_LMS_SWAPIN_GROUPBY
  std::string vdnn_variant = "all";       ///< vdnn: "all" or "conv"          SPILLWAY_VDNN_VARIANT

  // Reports.
  std::string chrome_trace;               ///< write a Chrome trace of real iterations here  SPILLWAY_CHROME_TRACE

  /// The defaults, overridden by every SPILLWAY_* variable that is set.
  static session_config from_env();
  /// The defaults, overridden by the keys of a JSON object (the field names above). Unknown keys,
  /// wrong types and bad sizes are config_errors naming the key.
  static session_config from_json_text(std::string_view json_text);
  static session_config from_json_file(const std::string& path);
  /// Applies set SPILLWAY_* variables on top of this config.
  void apply_env();

  /// Checks every field; throws config_error naming the first bad one and what would be right.
  void validate() const;
};

}  // namespace spillway

// Hardware profiles for the simulator: device memory, sustained compute, link and NVMe
// bandwidths, copy engines, host tier size. Built-ins are documented in offload/PROFILES.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // callers that use the json values include <nlohmann/json.hpp>

#include "prefetch/trace.hpp"

namespace spillway::offload {

struct hw_profile {
  std::string name;
  std::uint64_t device_bytes = 0;      ///< device memory
  double compute_flops_per_s = 0;      ///< sustained, at the precision the trace uses
  double hbm_bytes_per_s = 0;          ///< sustained device-memory bandwidth (roofline)
  double h2d_bytes_per_s = 0;          ///< effective host -> device bandwidth (pinned memory)
  double d2h_bytes_per_s = 0;          ///< effective device -> host bandwidth (pinned memory)
  int copy_engines = 2;                ///< 1: H2D and D2H share one queue; 2+: they overlap
  std::uint64_t host_bytes = 0;        ///< pinned host memory available to the host tier
  double nvme_read_bytes_per_s = 0;    ///< NVMe tier read bandwidth (all drives together)
  double nvme_write_bytes_per_s = 0;   ///< NVMe tier write bandwidth
  std::uint64_t nvme_bytes = 0;        ///< NVMe tier capacity
  /// The host as a compute resource for ops placed there (Note [Host ops] in prefetch/plan.hpp).
  /// All 0: the host runs no ops (a JSON profile without these fields).
  double host_mem_bytes_per_s = 0;     ///< sustained host-memory bandwidth, all sockets
  int host_cores = 0;                  ///< cores the host ops use, all sockets
  int host_vector_width = 0;           ///< fp32 flops per core per cycle (SIMD lanes x FMA units x 2)
  double host_clock_hz = 0;            ///< sustained all-core clock
  /// The network between data-parallel ranks (Note [Network stream] in offload/simulator.hpp):
  /// each rank's bandwidth each way (full duplex) and the latency of one step of a ring
  /// collective. 0: the profile gives no network; infinity: an unlimited network, on which
  /// collectives take no time (the reference a real network is compared with).
  double network_bytes_per_s = 0;
  double network_latency_s = 0;
  [[nodiscard]] bool has_network() const noexcept { return network_bytes_per_s > 0; }

  /// Duration of an op placed on the host: max(host_bytes / host memory bandwidth,
  /// host_flops / (cores x vector width x clock)); infinite when the profile has no host rates.
  [[nodiscard]] double host_op_seconds(const op_desc& op) const noexcept;
  /// Whether the host rates are set (then ops may be placed on the host).
  [[nodiscard]] bool runs_host_ops() const noexcept { return host_mem_bytes_per_s > 0; }

  /// Duration of an op: measured_seconds if present, else the roofline
  /// max(flops / compute, bytes / hbm).
  [[nodiscard]] double op_seconds(const op_desc& op) const noexcept;
  /// Throws config_error naming the field when a rate or size is not positive.
  void validate() const;
};

/// Names of the built-in profiles: h200, a100-80g, v100-32g, v100-16g, titanx-12g.
std::vector<std::string> builtin_profile_names();
/// A built-in profile by name, or a JSON file path (anything that ends in .json).
/// Unknown names are a config_error listing the built-ins.
hw_profile get_profile(std::string_view name_or_path);

/// JSON form: {"name": "...", "device_memory": "16GB", "compute_tflops": 56, "hbm_gbps": 900,
/// "h2d_gbps": 12, "d2h_gbps": 12, "copy_engines": 2, "host_memory": "256GB",
/// "nvme_read_gbps": 3.2, "nvme_write_gbps": 2.0, "nvme_capacity": "2TB"} (GB/s are 1e9 B/s).
/// Optional, all four or none: "host_memory_gbps" (sustained), "host_cores",
/// "host_vector_width" (fp32 flops per core per cycle), "host_ghz".
/// Optional, both or neither: "network_gbps" (GB/s each way per rank), "network_latency_us"
/// (per ring step).
/// Missing fields are a config_error naming them.
hw_profile profile_from_json(const nlohmann::json& j);
nlohmann::json profile_to_json(const hw_profile& p);

}  // namespace spillway::offload

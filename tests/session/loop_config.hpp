// The session config the loop tests run under: the cpu backend with 64 MiB of device memory and
// an unlimited link, a policy, and the budget as a ratio of the first recorded iteration's
// footprint (0: the whole device).
#pragma once

#include <cstdint>
#include <string>

#include "offload/session_config.hpp"

namespace spillway::testing {

inline session_config config_for(const std::string& policy, double ratio) {
  session_config c;
  c.backend = "cpu";
  c.cpu_device_memory = std::uint64_t{64} << 20;
  c.link_gbps = 0;
  c.policy = policy;
  c.device_budget_ratio = ratio;
  return c;
}

}  // namespace spillway::testing

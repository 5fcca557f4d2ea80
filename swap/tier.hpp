// tier: where a copy of a tensor's bytes lives (device memory, the host tier, the NVMe tier).
// One definition for the swap tiers and for the plans that move tensors between them. Header
// only, so that whoever includes it (prefetch/plan.hpp, without the swap library) links.
#pragma once

namespace spillway {

enum class tier { device, host, nvme };

/// "device", "host" or "nvme".
constexpr const char* to_string(tier t) noexcept {
  switch (t) {
    case tier::device: return "device";
    case tier::host: return "host";
    case tier::nvme: return "nvme";
  }
  return "?";
}

}  // namespace spillway

// tier: where a copy of a tensor's bytes lives (device memory, the host tier, the NVMe tier).
// One definition for the swap tiers and for the plans that move tensors between them.
#pragma once

namespace spillway {

enum class tier { device, host, nvme };

/// "device", "host" or "nvme".
const char* to_string(tier t) noexcept;

}  // namespace spillway

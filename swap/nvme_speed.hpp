// How fast the NVMe tier moves bytes here, measured rather than assumed: one write and one read
// of a test tensor through the tier itself (its files, its O_DIRECT or buffered mode, its rings),
// so the planner weighs NVMe against the link with this machine's figures.
#pragma once

#include <cstddef>

#include "swap/nvme_tier.hpp"

namespace spillway {

class pinned_host_pool;

struct nvme_speed {
  double read_bytes_per_s = 0;
  double write_bytes_per_s = 0;
  std::size_t bytes = 0;  ///< bytes of the test tensor; 0 when there was no room to measure
};

/// Writes a test tensor of up to `bytes` (less when the tier's free space is smaller, whole
/// blocks per file) from a buffer of `pool`, reads it back, erases it, and returns the rates.
/// The tier keeps none of it. `bytes` 0 or no free space: nothing is measured (bytes = 0).
[[nodiscard]] nvme_speed measure_speed(nvme_tier& tier, pinned_host_pool& pool, std::size_t bytes = std::size_t{16} << 20);

}  // namespace spillway

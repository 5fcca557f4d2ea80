// Device memory in use over time: the executor's measured timeline and the simulator's modelled
// one use the same sample, so one Chrome-trace counter serves both. Header only (plan types).
#pragma once

#include <cstdint>

namespace spillway {

/// Device bytes in use from `at_us` on (microseconds since the run or the replay began).
struct memory_sample {
  double at_us = 0;
  std::uint64_t bytes = 0;
};

}  // namespace spillway

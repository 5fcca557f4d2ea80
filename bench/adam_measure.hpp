// The measurement behind `spillway-bench adam`: the CPU Adam's bytes per second against a
// STREAM-style triad over the same buffer bytes with the same threads, in the same run.
#pragma once

#include <cstddef>

#include "kernels/cpu_adam.hpp"

namespace spillway::bench {

/// Bytes one fp32 Adam update moves: reads p, g, m, v and writes p, m, v.
inline constexpr double adam_bytes_per_update = 28.0;
/// Bytes one triad element moves as STREAM counts them: a[i] = b[i] + s c[i] reads b, c, writes a
/// (the read of a that a write-allocate cache makes is not counted).
inline constexpr double triad_bytes_per_element = 12.0;

struct adam_measure_options {
  std::size_t elements = std::size_t{1} << 24;  ///< parameters updated per Adam step
  int repeats = 5;                              ///< timed turns of each (after one warm-up turn)
  kernels::cpu_isa isa = kernels::cpu_isa::best;
};

struct adam_measure_result {
  std::size_t elements = 0;        ///< Adam's parameters (4 buffers of this many floats)
  std::size_t triad_elements = 0;  ///< elements of each of the triad's 3 buffers: the same bytes in all
  int repeats = 0;
  int threads = 0;                 ///< oneTBB's threads, for both
  kernels::cpu_isa isa = kernels::cpu_isa::scalar;  ///< the body that ran (never best)
  bool numa_placed = false;        ///< buffers placed by libnuma (else plain aligned memory)
  double adam_seconds = 0;         ///< best Adam step
  double triad_seconds = 0;        ///< best triad pass
  [[nodiscard]] double updates_per_second() const { return static_cast<double>(elements) / adam_seconds; }
  [[nodiscard]] double adam_bytes_per_second() const { return adam_bytes_per_update * updates_per_second(); }
  [[nodiscard]] double triad_bytes_per_second() const {
    return triad_bytes_per_element * static_cast<double>(triad_elements) / triad_seconds;
  }
  [[nodiscard]] double ratio() const { return adam_bytes_per_second() / triad_bytes_per_second(); }
};

/// Allocates Adam's four buffers and the triad's three (numa_array, the same total bytes), then
/// alternates an Adam step and a triad pass, one warm-up turn and `repeats` timed turns; keeps
/// the best of each. usage_error for an ISA this CPU lacks or no elements.
[[nodiscard]] adam_measure_result measure_adam_against_triad(const adam_measure_options& o);

}  // namespace spillway::bench

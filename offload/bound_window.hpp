// The memory-window bound: stretches of the trace where a value cannot be on the device, nor be
// made again there, and must cross the link beside too little compute (Note [Memory windows] in
// bound_window.cpp); a part of the lower bound (simulator_bounds.cpp).
#pragma once

#include <cstdint>

#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "prefetch/trace.hpp"

namespace spillway::offload::detail {

struct window_bound {
  double seconds = 0;     ///< compute of every op plus the waits the windows force
  double wait_seconds = 0;  ///< those waits
  op_index op = 0;        ///< the op that ends the window with the longest wait (0: none)
};

/// A step no plan keeping `budget` beats, recomputing or not (Note [Memory windows]).
window_bound memory_window_bound(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget);

}  // namespace spillway::offload::detail

// Op times for a trace recorded on one machine and planned for another (spillway-bench plan
// --fit-step-ms): from each op's flops and bytes on the target's profile, at the compute rate
// that makes the ops add up to the target's measured resident step.
#pragma once

#include "offload/profile.hpp"
#include "prefetch/trace.hpp"

namespace spillway::bench {

/// The least time an op takes here (a kernel launch and a small kernel).
inline constexpr double least_op_seconds = 5e-6;

/// Sets each op's measured_seconds to max(flops / F, bytes / hw's HBM rate, least_op_seconds),
/// with F (returned, flop/s) found by bisection so that they add up to `step_ms`, to a relative
/// 1e-9. The trace's own measured times are set aside. A step shorter than the ops take at the
/// HBM rate alone is a config_error that names both; so is any step longer than that when no op
/// counts flops (no rate then changes a time).
double fit_op_times(trace& t, const offload::hw_profile& hw, double step_ms);

}  // namespace spillway::bench

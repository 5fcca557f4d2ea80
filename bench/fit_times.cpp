#include "bench/fit_times.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "device/error.hpp"
#include "device/units.hpp"

namespace spillway::bench {

double fit_op_times(trace& t, const offload::hw_profile& hw, double step_ms) {
  auto seconds = [&](const op_desc& o, double f) {
    return std::max({o.flops / f, o.bytes / hw.hbm_bytes_per_s, least_op_seconds});
  };
  auto total = [&](double f) {
    double sum = 0;
    for (const auto& o : t.ops) sum += seconds(o, f);
    return sum;
  };
  const double want = step_ms / 1e3;
  if (!(want > 0) || !std::isfinite(want))
    throw config_error("--fit-step-ms: " + format_real(step_ms) + " is not a step time; give milliseconds above 0");
  const double floor_s = total(1e300);
  if (floor_s > want)
    throw config_error("--fit-step-ms: " + format_real(step_ms) + " ms is shorter than the trace's " +
                       std::to_string(t.ops.size()) + " ops take at " + hw.name + "'s memory rate alone (" +
                       format_real(floor_s * 1e3) + " ms, each at least 5 us); give a longer step");
  // The slowest rate needed: total() falls as the rate rises, and only the ops with flops grow
  // with it; where none has any, no rate stretches them to the step.
  double lo = 1.0;
  while (total(lo) < want && lo > 1e-290) lo *= 1e-10;
  if (total(lo) < want)
    throw config_error(std::string("--fit-step-ms: ") +
                       (std::any_of(t.ops.begin(), t.ops.end(), [](const op_desc& o) { return o.flops > 0; })
                            ? "the trace's ops count too few flops"
                            : "no op of the trace counts any flops") +
                       ", so no compute rate makes its " + std::to_string(t.ops.size()) + " ops add up to " +
                       std::to_string(step_ms) +
                       " ms (they take " + std::to_string(floor_s * 1e3) +
                       " ms at the memory rate); give the ops their flops (the flops argument of Session::op) "
                       "or plan the trace with its own measured times");
  double hi = 1e300;  // total(lo) >= want >= total(hi)
  for (int i = 0; i < 2000 && hi / lo > 1 + 1e-12; ++i) {
    const double mid = std::sqrt(lo) * std::sqrt(hi);
    (total(mid) > want ? lo : hi) = mid;
  }
  for (auto& o : t.ops) o.measured_seconds = seconds(o, hi);
  return hi;
}

}  // namespace spillway::bench

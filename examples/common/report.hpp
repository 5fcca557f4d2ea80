// Text and JSON for a training run: the per-step progress line, the closing summary, and the
// --report JSON. Returns strings; the programs print them.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>  // callers that use the json values include <nlohmann/json.hpp>

#include "examples/common/trainer.hpp"

namespace spillway::examples {

/// A loss with nine significant digits ("%.9g"): equal text means equal float bits.
[[nodiscard]] std::string format_loss(float loss);

/// "step   3/10  loss 5.43210001  412.3 ms  h2d 12.00 MiB  d2h 8.00 MiB  nvme 0 B/0 B  stalls 2 (1.3 ms)".
[[nodiscard]] std::string format_step(int step, int steps, float loss, const iteration_report& r);

/// What the run was: model, backend, policy, footprint against budget (and device memory).
[[nodiscard]] std::string format_header(const run_result& r);

/// Several lines: footprint against budget, peak device bytes, bytes per tier, stalls, median
/// step time, and the Chrome trace path.
[[nodiscard]] std::string format_summary(const run_result& r);

/// The --report document: losses (as "%.9g" prints them), step_ms, footprint_bytes,
/// device_budget_bytes, peak_device_bytes, h2d/d2h/nvme bytes, stall_ms, and per-step detail.
[[nodiscard]] nlohmann::json report_json(const run_result& r);

/// Writes report_json(r) to `path`; io_error naming the path when it cannot.
void write_report(const run_result& r, const std::string& path);

}  // namespace spillway::examples

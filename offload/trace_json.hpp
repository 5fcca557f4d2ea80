// Trace as JSON: the form users write by hand or export from another framework.
// Errors are config_errors that name the position (tensors[i] / ops[i] and the field).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>  // callers that use the json values include <nlohmann/json.hpp>

#include "prefetch/trace.hpp"

namespace spillway::offload {

/// Format:
///   { "tensors": [ {"name": "w1", "bytes": 4096 | "16MiB", "kind": "parameter"}, ... ],
///     "ops": [ {"name": "fc1", "reads": ["x", "w1"], "writes": ["h1"],
///               "flops": 1e9, "bytes": 123, "seconds": 0.001,
///               "phase": "forward", "category": "matmul", "layer": 0}, ... ] }
/// reads/writes name tensors by name or by index. flops, bytes, seconds, phase, category and
/// layer are optional. The result is validated (trace::validate()).
trace trace_from_json(const nlohmann::json& j);
/// Parses text; a syntax error is a config_error with the byte offset.
trace trace_from_json_text(std::string_view text);
/// Reads a file; a missing file is a config_error naming it.
trace load_trace(const std::string& path);

nlohmann::json trace_to_json(const trace& t);

}  // namespace spillway::offload

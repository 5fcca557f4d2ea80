// Lifetime analyzer: when each tensor of a trace is used and idle, how many bytes are live at
// each op, the peak, and the least device memory any plan can need.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // callers that use the json values include <nlohmann/json.hpp>

#include "prefetch/trace.hpp"

namespace spillway::offload {

/// One use of a tensor by an op.
struct tensor_use {
  op_index op = 0;
  bool reads = false;
  bool writes = false;
};

/// Ops strictly between two uses during which the tensor is not touched. For a persistent
/// tensor the gap from its last use round to its first use in the next iteration has
/// wraps = true (then `after` > `before` as op numbers).
struct idle_gap {
  op_index after = 0;     ///< the use before the gap
  op_index before = 0;    ///< the use after the gap
  std::uint32_t ops = 0;  ///< number of ops inside the gap
  bool wraps = false;
  bool contents_needed = false;  ///< the use after the gap reads the tensor
};

struct tensor_lifetime {
  std::vector<tensor_use> uses;  ///< in op order
  std::vector<idle_gap> gaps;
  bool used() const noexcept { return !uses.empty(); }
  op_index first_use() const noexcept { return uses.front().op; }
  op_index last_use() const noexcept { return uses.back().op; }
  /// True when the value at the end of the iteration is read by the next one (persistent
  /// tensors whose first use in the iteration reads them).
  bool crosses_boundary = false;
  bool written = false;  ///< some op of the iteration writes it
};

/// Note [Live and needed bytes]
/// live bytes: what a run that never swaps holds: persistent tensors all the time, a transient
///   tensor from the op that first writes it to its last use (inclusive).
/// needed bytes: tensors whose value must exist somewhere (device or tier) during an op:
///   those the op touches, plus those whose next use (cyclically, for persistent tensors)
///   reads them. A gradient between the optimizer's read and the next backward write is live
///   but not needed. Lower bounds use needed bytes, so they stay true lower bounds.
struct lifetime_report {
  std::vector<tensor_lifetime> tensors;
  std::vector<std::uint64_t> live_bytes_during;   ///< per op, including its working set
  std::vector<std::uint64_t> live_bytes_after;    ///< per op, after its dead transients go
  std::vector<std::uint64_t> needed_bytes_during;  ///< per op, see the note
  /// Per op: needed bytes of tensors the iteration writes (their fresh value must be copied
  /// out if they leave the device).
  std::vector<std::uint64_t> needed_written_bytes_during;
  /// Per op: bytes of tensors the op does not touch whose value was written earlier in this
  /// iteration and is read later in it (a copy out must finish before the op, the copy back
  /// start after it; see Note [Lower bound] in simulator_bounds.cpp).
  std::vector<std::uint64_t> in_iteration_idle_bytes;
  std::vector<std::uint64_t> working_set_bytes;   ///< per op
  std::uint64_t peak_live_bytes = 0;
  op_index peak_op = 0;
  /// The least device memory any plan can need: the largest working set of a single op.
  std::uint64_t min_budget_bytes = 0;
  op_index min_budget_op = 0;
  std::uint64_t persistent_bytes = 0;
  std::uint64_t bytes_by_kind[tensor_kind_count] = {};
  double total_flops = 0;
};

/// Analyzes a validated trace (calls trace::validate()).
lifetime_report analyze(const trace& t);

/// A readable summary: totals by kind, the peak and where, the minimum budget, the largest
/// tensors and their gaps.
std::string format_report(const lifetime_report& r, const trace& t);

/// Everything in the report as JSON (per-tensor uses and gaps, per-op bytes).
nlohmann::json report_to_json(const lifetime_report& r, const trace& t);

}  // namespace spillway::offload

// The least bytes any plan must move over the link in one iteration, counted per use (Note
// [Per-use transfer bound] in bound_transfer.cpp); a part of the lower bound (simulator_bounds.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "offload/lifetime.hpp"
#include "prefetch/trace.hpp"

namespace spillway::offload {

/// Least bytes per iteration each way (and, past the host tier, to and from NVMe) that every
/// plan keeping the budget moves, recomputing or not.
struct transfer_floor {
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_write_bytes = 0;
};

struct transfer_floor_options {
  /// Count only persistent tensors (parameters, gradients, optimizer state): every transient
  /// value is taken as free to drop and make again. Still a floor, a lower one.
  bool persistent_only = false;
  /// Iterations laid end to end for the per-use count (0: chosen from the trace's size).
  std::size_t iterations = 0;
};

transfer_floor least_transfers(const trace& t, const lifetime_report& r, std::uint64_t budget, std::uint64_t host_bytes,
                               const transfer_floor_options& opt = {});

namespace detail {
/// Per op w: the first op after w that writes one of w's reads (ops.size() when none does), for
/// a recomputable op; 0 for one that is not. A value op w wrote can be made again by rerunning w
/// before any op up to that one (Note [Recomputation]), never later.
std::vector<op_index> remake_until(const trace& t, const lifetime_report& r);
}  // namespace detail

}  // namespace spillway::offload

// Collectives between data-parallel ranks: their kinds, what a ring moves per rank, and the
// table that tells the simulator which ops of a rank's trace are collectives (its network stream).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "prefetch/trace.hpp"

namespace spillway::offload {

/// reduce_scatter: every rank gives the whole buffer and keeps the sum of its 1/N part;
/// all_gather: every rank gives its 1/N part and receives the whole buffer; all_reduce: every
/// rank gives the whole buffer and receives the whole sum.
enum class collective_kind : std::uint8_t { reduce_scatter, all_gather, all_reduce };
[[nodiscard]] std::string_view to_string(collective_kind k) noexcept;
[[nodiscard]] std::optional<collective_kind> parse_collective_kind(std::string_view s) noexcept;

/// Note [Ring collectives]
/// On a ring of N ranks a reduce-scatter of a B-byte buffer takes N-1 steps; in each a rank
/// sends one B/N chunk to its successor and receives one from its predecessor, so it sends and
/// receives (N-1)/N x B in all. An all-gather is the same in reverse; an all-reduce is a
/// reduce-scatter then an all-gather: 2(N-1) steps, 2(N-1)/N x B each way. Each step pays the
/// link's latency once, so a collective costs steps x latency + wire bytes / bandwidth, where the
/// link is full duplex and the sends and the receives overlap. One rank (N = 1) moves nothing.
struct ring_cost {
  std::uint64_t wire_bytes = 0;  ///< bytes this rank sends, and as many it receives
  std::uint32_t steps = 0;       ///< latency-bound steps
};
[[nodiscard]] ring_cost ring_cost_of(collective_kind k, std::uint64_t bytes, std::uint32_t ranks) noexcept;

/// One collective in a rank's trace: op `op` stands for it (its reads are what the rank gives,
/// its writes what it receives), `bytes` is the whole buffer (every rank's part together).
struct collective {
  op_index op = 0;
  collective_kind kind = collective_kind::all_reduce;
  std::uint64_t bytes = 0;
};

/// The collectives of one rank's trace (offload/data_parallel.hpp makes it). Given to the
/// simulator (sim_options::comm), each listed op runs on the network stream instead of the
/// compute stream (Note [Network stream] in offload/simulator.hpp).
struct comm_schedule {
  std::uint32_t ranks = 1;
  std::vector<collective> collectives;  ///< sorted by op, at most one per op

  /// The collective op k stands for, or nullptr.
  [[nodiscard]] const collective* find(op_index k) const noexcept;
  /// Throws usage_error naming the entry when an op is out of range for `t`, listed twice or
  /// out of order, or ranks is 0.
  void validate(const trace& t) const;
  /// Sum over the collectives of the bytes each rank sends.
  [[nodiscard]] std::uint64_t wire_bytes() const noexcept;
};

}  // namespace spillway::offload

// Device layout: an address for every device allocation a plan makes in one iteration, packed
// ahead of time so that following the plan never meets a fragmented arena (Note [Layout]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "prefetch/plan.hpp"
#include "prefetch/trace.hpp"

namespace spillway {

// Note [Layout]
// A plan fixes, op by op, which tensors are on the device: the executor allocates a tensor when
// a prefetch is issued (before op k), when op k needs it and it is not there, or when
// begin_iteration brings back a persistent tensor that starts on the device; it frees it after
// an eviction or a release. Best fit at run time packs these allocations in arrival order and,
// with budgets filled to the last few percent, leaves free bytes in pieces too small for the
// next tensor: the plan then misses (an on-demand eviction) although it fits by count. The
// layout replays the plan's allocations on a timeline of slots (layout_slot), then places them
// greedily, largest first, each at the lowest address where it overlaps in time no block placed
// before it (the greedy-by-size heuristic of static memory planners; a few orders are tried and
// the tightest kept). Given the plan's timing (plan_timing, from the simulator), blocks must
// also be apart in device time: bytes whose copy out is still running are not given to a
// prefetch that starts meanwhile, so no copy in waits on a copy out the plan did not expect. A
// persistent tensor still resident when the iteration ends keeps its address into the next
// iteration: its block wraps around the timeline. The executor asks the layout for the address of each allocation it makes
// while following the plan and falls back to best fit when the address is taken (the run
// departed from the plan). An op's scratch (executor::scratch) is not in the plan; it is taken
// from the top of the arena, where the layout, packed from address 0 up, plans least. Where the
// layout's blocks leave no free run long enough, scratch asked for with the op (begin_op's) is
// placed best fit with the op's tensors once everything has left the device. An op the
// plan places on the host allocates nothing on the device (Note [Host ops in the executor]): its
// tensors get no block for it, and the device copy of what it writes ends at its step.

/// The timeline position of an allocation, as the executor makes them.
struct layout_slot {
  static constexpr std::uint32_t start_frees = 0;   ///< begin_iteration: tensors leave for their tier
  static constexpr std::uint32_t start_fetch = 1;   ///< begin_iteration: persistents come back
  static std::uint32_t prefetch(op_index k) { return 4 * k + 2; }
  /// The reruns before op k (Note [Rerun temps before the op] in recompute.hpp).
  static std::uint32_t rerun(op_index k) { return 4 * k + 3; }
  static std::uint32_t place(op_index k) { return 4 * k + 4; }
  static std::uint32_t after(op_index k) { return 4 * k + 5; }
  static std::uint32_t end(std::size_t ops) { return static_cast<std::uint32_t>(4 * ops + 2); }
};

/// One block of the layout: a tensor's stay on the device, as slots [from, to); two spans when it
/// wraps around the iteration boundary.
struct layout_block {
  tensor_id id = 0;
  std::size_t bytes = 0;   ///< as placed (device_budget::placed)
  std::size_t offset = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> spans;
};

struct device_layout {
  std::size_t extent = 0;          ///< bytes from address 0 to the end of the highest block
  std::size_t peak_live = 0;       ///< most bytes allocated at one slot (a floor on extent)
  std::size_t blocks = 0;
  /// Address of tensor `id`'s allocation at `slot`, if the plan makes one there.
  [[nodiscard]] std::optional<std::size_t> offset(tensor_id id, std::uint32_t slot) const;

  std::unordered_map<std::uint64_t, std::size_t> offsets;  ///< key: id << 32 | slot
  std::vector<layout_block> placed;                        ///< every block, for checks and reports
};

/// When a plan's allocations are first and last used on the device, in the time of a timed
/// replay of the plan (the simulator's). With it, make_layout also keeps apart blocks whose
/// device use overlaps in time: bytes are not handed to a prefetch before the copy out of their
/// last tensor has ended, so no allocation waits for a copy the replay did not wait for.
struct plan_timing {
  std::vector<double> op_start, op_end;  ///< per op (a host op's run on the host), seconds from the iteration's start
  double step = 0;                       ///< the iteration's length
  /// At key(x, k): when the copy in of the prefetch of x issued before op k starts.
  std::unordered_map<std::uint64_t, double> load_start;
  /// At key(x, k): when the copy out of x evicted after op k ends.
  std::unordered_map<std::uint64_t, double> save_end;
  static std::uint64_t key(tensor_id x, op_index k) { return (static_cast<std::uint64_t>(x) << 32) | k; }
};

/// Packs the allocations of one iteration of `t` following `p`. `release_after[x]`, where set
/// (>= 0), is the op after which the program released transient x (else its last use); every
/// block is rounded as the budget places it (device_budget::placed); `timing`, where given, adds
/// the device-time rule; `shaken_orders` more packings follow the fixed orders (Note [Shaken orders]).
[[nodiscard]] device_layout make_layout(const trace& t, const plan& p, std::span<const std::int64_t> release_after,
                                        const plan_timing* timing = nullptr, std::size_t shaken_orders = 0);

// Note [Shaken orders]
// Greedy packing is sensitive to the order in which blocks are placed, and for plans that fill
// the budget for long stretches no fixed order is reliably best. A shaken order is "largest
// first" with each block's size multiplied by a random factor in [1 - s, 1 + s] (s cycling
// through 5%, 10%, 20%, 40%), so blocks of similar size trade places. Each is packed first fit,
// and the tightest packing over all orders is kept. The generator has a fixed seed, so a plan
// always packs the same way. Each order costs one packing, so fit_plan asks for them only when
// the fixed orders miss the budget by at most 5%. In the replay bench at 1/4 of the footprint,
// they pack gpt2-small's 24.7 MiB plan in 29.8 MiB instead of 31.4, within the 30 MiB budget.

}  // namespace spillway

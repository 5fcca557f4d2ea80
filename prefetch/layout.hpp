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
// before it (the greedy-by-size heuristic of static memory planners; a few orders are tried, and
// lowest first, Note [Lowest first], and the tightest is kept). Given the plan's timing (plan_timing, from the simulator), blocks must
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
  /// Its stay in device time, seconds from the iteration's start (two spans when it wraps); empty
  /// when packed without a plan_timing.
  std::vector<std::pair<double, double>> times;
};

/// Which way of packing gave a layout its addresses (the tightest of those tried).
enum class layout_packer : std::uint8_t {
  fixed_order,   ///< a fixed order, first fit or smallest gap (Note [Layout])
  lowest_first,  ///< Note [Lowest first], or its placement order packed first fit
  shaken_order,  ///< Note [Shaken orders]
  refined_order  ///< Note [Refined orders]
};

struct device_layout {
  std::size_t extent = 0;          ///< bytes from address 0 to the end of the highest block
  std::size_t peak_live = 0;       ///< most bytes allocated at one slot (a floor on extent)
  std::size_t blocks = 0;
  layout_packer packer = layout_packer::fixed_order;
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

/// How hard make_layout looks beyond its fixed orders.
struct layout_search {
  std::size_t shaken_orders = 0;  ///< more packings after the fixed orders (Note [Shaken orders])
  std::size_t refine_repacks = 0;  ///< whole packings' worth of refinement (Note [Refined orders])
  std::size_t goal = 0;           ///< the refinement stops once the extent is at most this
};

/// Packs the allocations of one iteration of `t` following `p`. `release_after[x]`, where set
/// (>= 0), is the op after which the program released transient x (else its last use); every
/// block is rounded as the budget places it (device_budget::placed); `timing`, where given, adds
/// the device-time rule; `search` asks for more orders than the fixed ones.
[[nodiscard]] device_layout make_layout(const trace& t, const plan& p, std::span<const std::int64_t> release_after,
                                        const plan_timing* timing = nullptr, const layout_search& search = {});

// Note [Shaken orders]
// Greedy packing is sensitive to the order in which blocks are placed, and for plans that fill
// the budget for long stretches no fixed order is reliably best. A shaken order is "largest
// first" with each block's size multiplied by a random factor in [1 - s, 1 + s] (s cycling
// through 5%, 10%, 20%, 40%), so blocks of similar size trade places. Each is packed first fit,
// and the tightest packing over all orders is kept. The generator has a fixed seed, so a plan
// always packs the same way. Each order costs one packing, so fit_plan asks for them only when
// the fixed orders miss the budget by at most 5%. In the replay bench at 1/4 of the footprint,
// they pack gpt2-small's 24.7 MiB plan in 29.8 MiB instead of 31.4, within the 30 MiB budget.

// Note [Lowest first]
// Orders pack a block at a time wherever it fits among those placed before it, so a block placed
// early may end up high and leave gaps under it that no later block fills. Lowest first places
// blocks from the bottom up instead: every block has a floor, the top of the highest block placed
// so far that it may not share bytes with (alive with it in the executor's order or, when timed,
// on the device), and the block with the lowest floor is placed next, at its floor; ties go to
// the block with the most bytes x slots (or, in other rounds, the most bytes or the longest life).
// No gap is left below the floors, but a block whose floor rises past free bytes cannot use them:
// each placement order is therefore packed first fit too. Its cost is the list of pairs of blocks
// alive together and a priority queue over them; past 4 million pairs (a long iteration whose
// long-lived blocks meet nearly every other) it is left out. In the plan bench (auto's plans, h200 profile, packed with
// device time) it packs GPT-2 large's plan for 0.95 of 1/4 of its footprint in 9,140.7 MiB where
// the fixed orders needed 9,444.6, and ResNet-50's for 0.86 of 1/8 in 709.8 MiB instead of
// 740.2.

// Note [Refined orders]
// Shaken orders draw whole new orders; a refinement edits the tightest order found so far. The
// block that ends highest sets the extent, so it moves to a random earlier place in the order
// (to be placed while low gaps are still free), or, half the time, one of the blocks it shares
// time with and was placed after moves to a random place after it (to leave it room). Only the
// blocks from the first changed place on are placed again. An edit is kept when it packs no
// looser, so the search walks across equal extents; when it packs looser, half the time the
// block that ended highest in it moves next, so that a search stuck on one block tries others.
// The search stops at the goal, at the most bytes alive at once (no packing ends lower), or when
// it has done `refine_repacks` whole packings' worth of work (blocks compared with those placed)
// or 400 million comparisons (about two seconds). A fixed seed again: a plan always packs the
// same way. Gains are a percent or two. Packed with device time, on the h200 profile, 1,000
// packings' worth: GPT-2 large's plan for 1/4 of its footprint (9,115.0 MiB at once) from
// 9,859.8 MiB to 9,701.9 (400 million comparisons, 3.3 s), GPT-3 13B's for 0.969 of 1/4 from
// 74,154 MiB to 73,923, ResNet-50's for 0.95 of 1/8 from 764.0 MiB to 753.5, and for 0.969 of 1/4
// from 1,382.8 MiB to 1,355.7, within its budget of 1,378.0. fit_plan asks for it on misses of at
// most 10%, where it is worth a try.

}  // namespace spillway

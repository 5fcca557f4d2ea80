// fit_plan: a plan whose device allocations, packed ahead (prefetch/layout.hpp), fit the budget.
// The executor places allocations at the packed addresses when the packing fits, so a run that
// follows the plan never meets a fragmented arena. The plan for the whole budget (less the ops'
// scratch) is kept where its packing fits there; packing usually needs some room above the
// plan's own peak, so otherwise the plan is made under the budget by the packing margin of Note
// [Headroom] (allocator/device_budget.hpp), and lower while the packing still overshoots.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "allocator/device_budget.hpp"
#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "prefetch/layout.hpp"

namespace spillway::offload {

struct fitted_plan {
  plan p;                         ///< made for p.budget_bytes, the planning budget
  device_layout layout;           ///< the packing, timed by the simulator (timing_from_simulation)
  bool fits = false;              ///< layout.extent is within the device budget
  /// The layout is packed in the executor's order alone, not kept apart in device time: some
  /// allocations wait for the bytes it gives them (Note [Untimed layouts] in fit_plan.cpp).
  bool waits_for_addresses = false;
  /// The simulator's step time for p; where waits_for_addresses, with those waits.
  double predicted_seconds = 0;
  /// The packing margin p was made with: device_budget::no_margin when made for the whole budget
  /// (less the scratch), else the doublings asked for.
  int margin_doublings = 0;
};

/// Plans `t` (analyzed as `r`, once: every attempt reuses it) for `budget`'s planning bytes after
/// `margin_doublings` (Note [Headroom]); when the packed layout of that plan does not fit
/// `budget`, searches (bisection, `tries` plans at most, never below the least any plan needs)
/// for about the highest planning budget whose packing fits, and keeps the fastest plan it found
/// that fits. A packing that misses the budget by at most 5% is tried again with shaken orders
/// (Note [Shaken orders] in prefetch/layout.hpp), and one that misses by at most 10% with a
/// refinement of its tightest order (Note [Refined orders]). Where no plan it tried packs with
/// device time, the plans are packed in the executor's order alone, and where none made above
/// the least budget so fits, up to 2 * `tries` more plans are made down from the top until one fits; the
/// fastest that fits is kept, timed with the waits for its addresses (Note [Untimed layouts] in
/// fit_plan.cpp).
/// With device_budget::no_margin, the plan is first made for the whole budget less
/// `scratch_bytes` (the most scratch one op holds beside the plan, placed) and kept when its
/// packing fits below that; else as with no doublings, and where the plan at that margin fits,
/// up to three plans made between it and the whole budget are packed within that room, the
/// fastest that fits kept (made with no margin; Note [Above the margin] in fit_plan.cpp). `release_points` as make_layout takes
/// them (the executor's release_points()).
[[nodiscard]] fitted_plan fit_plan(const planner& pl, const trace& t, const lifetime_report& r, const hw_profile& hw,
                                   const device_budget& budget, int margin_doublings,
                                   std::span<const std::int64_t> release_points, std::uint64_t scratch_bytes = 0,
                                   int tries = 6);

/// When `p`'s ops run and its copies start and end, in the simulator's timeline of `p` on `hw`
/// (`r` is t's analysis), for make_layout.
[[nodiscard]] plan_timing timing_from_simulation(const trace& t, const lifetime_report& r, const plan& p,
                                                 const hw_profile& hw);

}  // namespace spillway::offload

// fit_plan: a plan whose device allocations, packed ahead (prefetch/layout.hpp), fit the budget.
// The executor places allocations at the packed addresses when the packing fits, so a run that
// follows the plan never meets a fragmented arena; packing needs some room above the plan's own
// peak, so the plan is made for a budget lowered by what the packing overshoots.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "offload/lifetime.hpp"
#include "offload/planner.hpp"
#include "offload/profile.hpp"
#include "prefetch/layout.hpp"

namespace spillway::offload {

struct fitted_plan {
  plan p;
  device_layout layout;           ///< the packing, timed by the simulator (timing_from_simulation)
  std::uint64_t plan_budget = 0;  ///< the budget the planner was given
  std::size_t layout_extent = 0;  ///< bytes the packed layout spans
  bool fits = false;              ///< layout_extent <= the device budget
};

/// Plans `t` for `device_budget` less `headroom` (a share of it); when the packed layout of that
/// plan does not fit `device_budget`, searches (bisection, `tries` plans at most, never below the
/// least any plan needs) for about the highest planning budget whose packing fits. A packing
/// that misses the budget by at most 5% is tried again with shaken orders (Note [Shaken orders]
/// in prefetch/layout.hpp). `release_points` and `granule` as make_layout takes them.
[[nodiscard]] fitted_plan fit_plan(const planner& pl, const trace& t, const lifetime_report& r, const hw_profile& hw,
                                   std::uint64_t device_budget, double headroom,
                                   std::span<const std::int64_t> release_points, std::size_t granule, int tries = 6);

/// When `p`'s ops run and its copies start and end, in the simulator's timeline of `p` on `hw`,
/// for make_layout.
[[nodiscard]] plan_timing timing_from_simulation(const trace& t, const plan& p, const hw_profile& hw);

}  // namespace spillway::offload

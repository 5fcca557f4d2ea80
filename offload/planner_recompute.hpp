// Planners that recompute (Note [Recomputing planners]): checkpoint and capuchin as baselines,
// and auto's search over what to drop and remake; all built on rerun schedules
// (offload/rerun_schedule.hpp) and the swap planners.
#pragma once

#include <cstdint>
#include <memory>

#include "offload/planner.hpp"

namespace spillway::offload::detail {

/// auto without recomputation: the sweep search of Note [auto] (planner_auto.cpp).
plan auto_swap_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                    const planner_options& opt);
/// auto with recomputation: the fastest of its swap-only plan, checkpoint's, capuchin's and
/// plans that remake the values with the most bytes per rerun second.
plan auto_recompute_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                         const planner_options& opt);

std::unique_ptr<planner> make_checkpoint_planner(const planner_options& opt);
std::unique_ptr<planner> make_capuchin_planner(const planner_options& opt);

}  // namespace spillway::offload::detail

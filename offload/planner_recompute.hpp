// Planners that recompute (Note [Recomputing planners]): checkpoint and capuchin as baselines,
// and auto's search over what to drop and remake; all built on rerun schedules
// (offload/rerun_schedule.hpp) and the swap planners.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "offload/planner.hpp"
#include "offload/rerun_schedule.hpp"
#include "offload/simulator.hpp"

namespace spillway::offload::detail {

/// auto without recomputation: the sweep search of Note [auto] (planner_auto.cpp). The sweeps
/// never evict a tensor whose entry in `stay` (indexed by tensor; null: none) is set.
plan auto_swap_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                    const planner_options& opt, const std::vector<char>* stay = nullptr);
/// How a search judges a candidate plan for the trace it plans: the simulator on another trace
/// the plan stands for (a device view's plan, judged as the whole trace's plan it becomes).
using plan_judge = std::function<sim_result(const plan&)>;

/// auto with recomputation: the fastest of its swap-only plan, checkpoint's, capuchin's and
/// plans that remake the values with the most bytes per rerun second; each judged by `judge`
/// where given, else simulated on `t`.
plan auto_recompute_plan(const trace& t, const lifetime_report& r, const hw_profile& hw, std::uint64_t budget,
                         const planner_options& opt, const plan_judge* judge = nullptr);

/// The candidates whose reruns need no other rerun, greedily in `order` (indices into `c`): a
/// candidate joins when each of its writer's inputs is persistent or alive (by `r`) until the
/// value is made again, none has joined, and its value is no joined writer's input. Returns
/// positions in `order`, ascending.
std::vector<std::size_t> single_reruns(const trace& t, const lifetime_report& r, const std::vector<remake_candidate>& c,
                                       const std::vector<std::size_t>& order);


std::unique_ptr<planner> make_checkpoint_planner(const planner_options& opt);
std::unique_ptr<planner> make_capuchin_planner(const planner_options& opt);

}  // namespace spillway::offload::detail

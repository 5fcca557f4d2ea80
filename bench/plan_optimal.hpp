// The optimal reference planner of the bench: keep, swap to the host tier or recompute, chosen
// for every idle gap of every tensor by a mixed-integer program solved with CBC or GLPK
// (bench/milp.hpp; Note [Optimal MILP]).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "offload/lifetime.hpp"
#include "offload/profile.hpp"
#include "offload/simulator.hpp"
#include "prefetch/plan.hpp"
#include "prefetch/trace.hpp"

namespace spillway::bench {

/// The largest trace plan_optimal takes (ops); larger ones get nullopt.
inline constexpr std::size_t optimal_max_ops = 400;

struct optimal_result {
  plan p;                       ///< the plan made from the best solution found
  offload::sim_result sim;      ///< that plan simulated: its step is the figure to report
  double objective_s = 0;       ///< the program's step time for that solution (its timing model)
  double bound_s = 0;           ///< the best lower bound the solver proved for the model
  double gap = 0;               ///< (objective - bound) / objective; 0 when proven optimal
  bool proven_optimal = false;  ///< the solver closed the gap (within 1e-4)
  std::string status;           ///< "optimal", "time limit", ...: what the solver said
  std::string solver;           ///< "CBC" or "GLPK"
  double solve_s = 0;           ///< wall time of the solve
  std::size_t binaries = 0, columns = 0, rows = 0;  ///< size of the program
};

/// Solves the keep / swap / recompute program for `t` at `budget` on `hw` within about
/// `time_limit_s` seconds, turns the best solution into a plan and simulates it.
/// Starting solutions: the least-memory one and the plans of the library's planners that the
/// program can express. GLPK starts from them; CBC from none (it does better so); where the
/// solver ends on nothing better in time, the best of them stands (status says so). GLPK's
/// feasibility pump may run past the limit by some seconds.
/// nullopt when the trace has no ops or more than optimal_max_ops, or when the budget is below
/// the least any plan needs; `why`, when given, says which. `solver`: one of milp_solvers()
/// (bench/milp.hpp), empty for the first; another throws std::invalid_argument before any work.
std::optional<optimal_result> plan_optimal(const trace& t, const offload::lifetime_report& r, const offload::hw_profile& hw,
                                           std::uint64_t budget, double time_limit_s, std::string* why = nullptr,
                                           const std::string& solver = {});

}  // namespace spillway::bench

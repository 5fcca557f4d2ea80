// A mixed-integer program as the optimal reference planner builds it (bench/plan_optimal.cpp),
// and the solvers the bench was built with: CBC (coinor-libcbc-dev) and GLPK (libglpk-dev), each
// where its library is found.
#pragma once

#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace spillway::bench {

/// Minimise the sum of the `objective` columns subject to every row. Columns are numbered from
/// 1 (column c has bounds lo[c - 1], hi[c - 1]; hi >= 1e29 means none); a binary column is 0 or 1.
struct milp {
  std::vector<double> lo, hi;
  std::vector<bool> binary;
  std::vector<int> objective;
  struct row {
    std::vector<std::pair<int, double>> terms;  ///< (column, coefficient); a column may repeat
    double lo = 0;                              ///< sum of the terms >= lo
  };
  std::vector<row> rows;
  /// Feasible solutions to start from (index c for column c; index 0 unused), best first; GLPK
  /// starts from them, CBC does not.
  std::vector<std::vector<double>> starts;
};

struct milp_solution {
  bool found = false;           ///< the solver returned a feasible solution (x holds it)
  std::vector<double> x;        ///< index c for column c
  double objective = 0;         ///< of x
  double bound = -std::numeric_limits<double>::infinity();  ///< best proven lower bound
  bool proven_optimal = false;
  std::string status;           ///< "optimal", "time limit", ...
};

/// The solvers this build has, the preferred first ("CBC", then "GLPK").
std::vector<std::string> milp_solvers();

/// Throws std::invalid_argument naming the solvers there are when `solver` is neither empty nor
/// one of milp_solvers().
void require_milp_solver(const std::string& solver);

/// Solves `m` within about `seconds` with `solver` (one of milp_solvers(); empty: the first).
/// GLPK's feasibility pump may run past the limit by some seconds. Prints nothing.
/// Throws as require_milp_solver does.
milp_solution solve_milp(const milp& m, double seconds, const std::string& solver = {});

namespace detail {
milp_solution solve_milp_cbc(const milp& m, double seconds);
milp_solution solve_milp_glpk(const milp& m, double seconds);
}  // namespace detail

}  // namespace spillway::bench

// solve_milp: hands the program to the solver asked for, among those this build has.
#include "bench/milp.hpp"

#include <algorithm>
#include <stdexcept>

namespace spillway::bench {

std::vector<std::string> milp_solvers() {
  std::vector<std::string> out;
#ifdef SPILLWAY_HAVE_CBC
  out.emplace_back("CBC");
#endif
#ifdef SPILLWAY_HAVE_GLPK
  out.emplace_back("GLPK");
#endif
  return out;
}

void require_milp_solver(const std::string& solver) {
  const auto have = milp_solvers();
  if (solver.empty() ? !have.empty() : std::find(have.begin(), have.end(), solver) != have.end()) return;
  std::string list;
  for (const auto& s : have) list += (list.empty() ? "" : ", ") + s;
  throw std::invalid_argument("MILP solver '" + solver + "' is not in this build; it has: " + (list.empty() ? "none" : list));
}

milp_solution solve_milp(const milp& m, double seconds, const std::string& solver) {
  require_milp_solver(solver);
  const std::string use = solver.empty() ? milp_solvers().front() : solver;
#ifdef SPILLWAY_HAVE_CBC
  if (use == "CBC") return detail::solve_milp_cbc(m, seconds);
#endif
#ifdef SPILLWAY_HAVE_GLPK
  if (use == "GLPK") return detail::solve_milp_glpk(m, seconds);
#endif
  throw std::logic_error("solve_milp: solver '" + use + "' listed but not dispatched");
}

}  // namespace spillway::bench

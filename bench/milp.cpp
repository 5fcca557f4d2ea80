// solve_milp: hands the program to the solver asked for, among those this build has.
#include "bench/milp.hpp"

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

milp_solution solve_milp(const milp& m, double seconds, const std::string& solver) {
  const auto have = milp_solvers();
  const std::string use = solver.empty() && !have.empty() ? have.front() : solver;
#ifdef SPILLWAY_HAVE_CBC
  if (use == "CBC") return detail::solve_milp_cbc(m, seconds);
#endif
#ifdef SPILLWAY_HAVE_GLPK
  if (use == "GLPK") return detail::solve_milp_glpk(m, seconds);
#endif
  std::string list;
  for (const auto& s : have) list += (list.empty() ? "" : ", ") + s;
  throw std::invalid_argument("MILP solver '" + use + "' is not in this build; it has: " + (list.empty() ? "none" : list));
}

}  // namespace spillway::bench

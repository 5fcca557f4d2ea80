// solve_milp with CBC (COIN-OR branch and cut).
#include <coin/Cbc_C_Interface.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <map>

#include "bench/milp.hpp"

namespace spillway::bench {

milp_solution detail::solve_milp_cbc(const milp& m, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const int ncols = static_cast<int>(m.lo.size()), nrows = static_cast<int>(m.rows.size());
  // The matrix by columns, as Cbc_loadProblem takes it.
  std::vector<std::map<int, double>> by_col(static_cast<std::size_t>(ncols));
  for (int i = 0; i < nrows; ++i)
    for (auto [c, v] : m.rows[static_cast<std::size_t>(i)].terms) by_col[static_cast<std::size_t>(c - 1)][i] += v;
  std::vector<CoinBigIndex> start{0};
  std::vector<int> index;
  std::vector<double> value, collb(m.lo), colub(m.hi), obj(static_cast<std::size_t>(ncols), 0), rowlb, rowub;
  for (const auto& col : by_col) {
    for (auto [i, v] : col)
      if (v != 0) {
        index.push_back(i);
        value.push_back(v);
      }
    start.push_back(static_cast<CoinBigIndex>(index.size()));
  }
  for (int c = 0; c < ncols; ++c) {
    if (m.binary[static_cast<std::size_t>(c)]) {
      collb[static_cast<std::size_t>(c)] = 0;
      colub[static_cast<std::size_t>(c)] = 1;
    } else if (colub[static_cast<std::size_t>(c)] >= 1e29) {
      colub[static_cast<std::size_t>(c)] = DBL_MAX;
    }
  }
  for (int c : m.objective) obj[static_cast<std::size_t>(c - 1)] = 1;
  for (const auto& r : m.rows) {
    rowlb.push_back(r.lo);
    rowub.push_back(DBL_MAX);
  }
  Cbc_Model* model = Cbc_newModel();
  Cbc_loadProblem(model, ncols, nrows, start.data(), index.data(), value.data(), collb.data(), colub.data(), obj.data(),
                  rowlb.data(), rowub.data());
  for (int c = 0; c < ncols; ++c)
    if (m.binary[static_cast<std::size_t>(c)]) Cbc_setInteger(model, c);
  // No starting solution is handed over: on the bench's cases CBC found better solutions within
  // the limit from none than from the best start (whose plan plan_optimal keeps where it is
  // better than what the solver returns).
  Cbc_setLogLevel(model, 0);
  Cbc_setAllowableFractionGap(model, 1e-4);
  const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Cbc_setMaximumSeconds(model, std::max(0.5, seconds - used));
  Cbc_solve(model);

  milp_solution out;
  const double* best = Cbc_bestSolution(model);
  out.found = best != nullptr;
  out.proven_optimal = Cbc_isProvenOptimal(model) != 0;
  out.status = out.proven_optimal ? "optimal"
               : Cbc_isSecondsLimitReached(model) ? "time limit"
               : Cbc_isProvenInfeasible(model)   ? "infeasible"
               : out.found                       ? "feasible"
                                                 : "no solution";
  if (out.found) {
    out.x.assign(best, best + ncols);
    out.x.insert(out.x.begin(), 0.0);
    out.objective = Cbc_getObjValue(model);
  }
  const double bound = Cbc_getBestPossibleObjValue(model);
  if (bound > -1e299 && bound < 1e299) out.bound = out.proven_optimal ? out.objective : bound;
  Cbc_deleteModel(model);
  return out;
}

}  // namespace spillway::bench

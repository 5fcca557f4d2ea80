// solve_milp with GLPK: the LP relaxation first (its bound), then branch and cut from the
// starting solutions, stopped on time by a callback.
#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "bench/milp.hpp"

namespace spillway::bench {

namespace {

struct search_state {
  const std::vector<std::vector<double>>* starts = nullptr;
  bool offered = false;
  double bound = -1e300;
  std::chrono::steady_clock::time_point deadline;
};

void on_search(glp_tree* tree, void* info) {
  auto* s = static_cast<search_state*>(info);
  if (glp_ios_reason(tree) == GLP_IHEUR && !s->offered) {
    s->offered = true;
    for (const auto& x : *s->starts) glp_ios_heur_sol(tree, x.data());
  }
  if (const int best = glp_ios_best_node(tree); best != 0) s->bound = std::max(s->bound, glp_ios_node_bound(tree, best));
  // GLPK looks at tm_lim only between some steps; this stops the search on time wherever it asks.
  if (std::chrono::steady_clock::now() > s->deadline) glp_ios_terminate(tree);
}

}  // namespace

milp_solution detail::solve_milp_glpk(const milp& m, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const int terminal_was = glp_term_out(GLP_OFF);  // GLPK prints nothing; the bench does
  glp_prob* lp = glp_create_prob();
  glp_set_obj_dir(lp, GLP_MIN);
  const int ncols = static_cast<int>(m.lo.size());
  glp_add_cols(lp, ncols);
  for (int c = 1; c <= ncols; ++c) {
    if (m.binary[c - 1]) glp_set_col_kind(lp, c, GLP_BV);
    else glp_set_col_bnds(lp, c, m.hi[c - 1] >= 1e29 ? GLP_LO : GLP_DB, m.lo[c - 1], m.hi[c - 1]);
  }
  for (int c : m.objective) glp_set_obj_coef(lp, c, 1);
  glp_add_rows(lp, static_cast<int>(m.rows.size()));
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0};
  for (std::size_t i = 0; i < m.rows.size(); ++i) {
    std::map<int, double> merged;
    for (auto [c, v] : m.rows[i].terms) merged[c] += v;
    for (auto [c, v] : merged)
      if (v != 0) {
        ia.push_back(static_cast<int>(i + 1));
        ja.push_back(c);
        ar.push_back(v);
      }
    glp_set_row_bnds(lp, static_cast<int>(i + 1), GLP_LO, m.rows[i].lo, 0);
  }
  glp_load_matrix(lp, static_cast<int>(ia.size() - 1), ia.data(), ja.data(), ar.data());
  glp_scale_prob(lp, GLP_SF_AUTO);

  const auto left_ms = [&] {
    const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::max(1, static_cast<int>((seconds - used) * 1e3));
  };
  milp_solution out;
  glp_smcp sp;
  glp_init_smcp(&sp);
  sp.msg_lev = GLP_MSG_OFF;
  sp.tm_lim = left_ms();
  const int lp_rc = glp_simplex(lp, &sp);
  const bool lp_solved = lp_rc == 0 && glp_get_status(lp) == GLP_OPT;
  const double root_bound = lp_solved ? glp_get_obj_val(lp) : -1e300;
  search_state st;
  st.starts = &m.starts;
  st.deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  if (lp_solved) {
    glp_iocp ip;
    glp_init_iocp(&ip);
    ip.msg_lev = GLP_MSG_OFF;
    ip.tm_lim = left_ms();
    ip.presolve = GLP_OFF;  // the callback offers a solution in the program's own columns
    ip.mip_gap = 1e-4;
    ip.br_tech = GLP_BR_PCH;
    ip.bt_tech = GLP_BT_BLB;
    // Tried on the bench's chains: the feasibility pump finds the better solutions (it is also
    // where GLPK runs past the time limit: it does not ask the callback); proximity search,
    // Gomory cuts and no cuts at all did no better within seconds.
    ip.mir_cuts = GLP_ON;
    ip.cov_cuts = GLP_ON;
    ip.fp_heur = GLP_ON;
    ip.cb_func = on_search;
    ip.cb_info = &st;
    const int rc = glp_intopt(lp, &ip);
    const int ms = glp_mip_status(lp);
    out.found = ms == GLP_OPT || ms == GLP_FEAS;
    out.proven_optimal = ms == GLP_OPT || rc == GLP_EMIPGAP;
    out.status = ms == GLP_OPT ? "optimal" : rc == GLP_ETMLIM || rc == GLP_ESTOP ? "time limit" : rc == GLP_EMIPGAP ? "gap reached" : out.found ? "feasible" : "no solution";
    if (out.found) {
      out.x.assign(static_cast<std::size_t>(ncols) + 1, 0);
      for (int c = 1; c <= ncols; ++c) out.x[static_cast<std::size_t>(c)] = glp_mip_col_val(lp, c);
      out.objective = glp_mip_obj_val(lp);
    }
  } else {
    out.status = "no LP solution in time";
  }
  const double bound = std::max(st.bound, root_bound);
  if (bound > -1e299) out.bound = bound;
  glp_delete_prob(lp);
  glp_term_out(terminal_was);
  return out;
}

}  // namespace spillway::bench

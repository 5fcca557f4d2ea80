// Planning a data-parallel rank (Note [Planning with the network] in rank_planning.hpp).
#include "offload/rank_planning.hpp"

#include <algorithm>

#include "device/error.hpp"
#include "device/units.hpp"
#include "offload/planner.hpp"

namespace spillway::offload {

namespace {
// The same copies issued soonest use first, the collectives counted among them: a prefetch
// for a later op than a prefetch or collective issued after it waits until then (it moves to
// that later step, still before its own use; past a collective means the step after it), and
// each step's list is in order of use. On a link the collectives share in order of issue,
// what the next op or collective waits for then does not queue behind copies for later ones
// (Note [Planning with the network]).
plan soonest_first(plan p, const comm_schedule& comm) {
  const std::size_t n = p.steps.size();
  // Scanning backward: for each use seen so far, the last step to issue after it; a Fenwick
  // tree answers the largest such step over the uses below a prefetch's own.
  std::vector<std::size_t> after(n + 1, 0);
  const auto note = [&](op_index use, std::size_t step) {
    for (std::size_t i = use + 1; i <= n; i += i & (~i + 1)) after[i] = std::max(after[i], step);
  };
  const auto last_below = [&](op_index use) {
    std::size_t m = 0;
    for (std::size_t i = use; i > 0; i -= i & (~i + 1)) m = std::max(m, after[i]);
    return m;
  };
  std::vector<std::vector<prefetch>> moved(n);
  for (std::size_t i = n; i-- > 0;) {
    auto& list = p.steps[i].prefetches;
    std::vector<prefetch> keep;
    for (const auto& pf : list) {
      const std::size_t to = std::max(i, last_below(pf.use));
      if (to == i) keep.push_back(pf);
      else moved[to].push_back(pf);
    }
    list = std::move(keep);
    for (const auto& pf : list) note(pf.use, i);
    if (comm.find(static_cast<op_index>(i)) && i + 1 < n) note(static_cast<op_index>(i), i + 1);
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto& list = p.steps[i].prefetches;
    list.insert(list.end(), moved[i].begin(), moved[i].end());
    std::stable_sort(list.begin(), list.end(), [](const prefetch& a, const prefetch& b) { return a.use < b.use; });
  }
  return p;
}
}  // namespace

rank_plan plan_rank(const rank_trace& r, const lifetime_report& rep, const hw_profile& hw, std::uint64_t budget,
                    const rank_plan_options& o) {
  if (o.policies.empty()) throw config_error("data parallel planning: give at least one policy");
  rank_plan best;
  sim_options so;
  so.comm = &r.comm;
  for (double share : o.link_shares)  // every share checked before any planning
    if (!(share > 0 && share <= 1))
      throw config_error("data parallel planning: a link share must be above 0 and at most 1 (such as 0.5), got " + format_real(share));
  for (const auto& name : o.policies) {
    const auto planner = make_planner(name);
    for (double share : o.link_shares) {
      hw_profile seen = hw;  // the link as the planner may count on it
      seen.h2d_bytes_per_s *= share;
      seen.d2h_bytes_per_s *= share;
      const plan made = planner->make_plan(r.t, rep, seen, budget);
      for (plan p : {made, soonest_first(made, r.comm)}) {
        auto sim = simulate(r.t, rep, p, hw, so);
        ++best.tried;
        if (!sim.feasible()) continue;
        if (!best.found || sim.step_seconds < best.sim.step_seconds) {
          best.p = std::move(p);
          best.policy = name;
          best.link_share = share;
          best.sim = std::move(sim);
          best.found = true;
        }
      }
    }
  }
  return best;
}

data_parallel_plan plan_data_parallel(const trace& t, const data_parallel_options& dp, const std::vector<double>& early_step_shares,
                                      const hw_profile& hw, std::uint64_t budget, const rank_plan_options& o) {
  if (early_step_shares.empty()) throw config_error("data parallel planning: give at least one early step share");
  data_parallel_plan best;
  bool any = false;
  for (double share : early_step_shares) {
    auto opt = dp;
    opt.early_step_share = share;
    auto r = make_rank_trace(t, opt);
    auto rep = analyze(r.t);
    if (rep.min_budget_bytes > budget && any) continue;  // this rank trace needs more (check_budget says so when none fits)
    auto p = plan_rank(r, rep, hw, budget, o);
    const bool better = p.found && (!best.best.found || p.sim.step_seconds < best.best.sim.step_seconds);
    if (!any || better) {
      best.best.tried += p.tried;
      const auto tried = best.best.tried;
      best.rank = std::move(r);
      best.report = std::move(rep);
      best.best = std::move(p);
      best.best.tried = tried;
      best.early_step_share = share;
      any = true;
    } else {
      best.best.tried += p.tried;
    }
  }
  return best;
}

}  // namespace spillway::offload

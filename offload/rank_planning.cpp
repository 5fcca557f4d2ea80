// Planning a data-parallel rank (Note [Planning with the network] in rank_planning.hpp).
#include "offload/rank_planning.hpp"

#include "device/error.hpp"
#include "offload/planner.hpp"

namespace spillway::offload {

rank_plan plan_rank(const rank_trace& r, const lifetime_report& rep, const hw_profile& hw, std::uint64_t budget,
                    const rank_plan_options& o) {
  if (o.policies.empty()) throw config_error("data parallel planning: give at least one policy");
  rank_plan best;
  sim_options so;
  so.comm = &r.comm;
  for (const auto& name : o.policies) {
    const auto planner = make_planner(name);
    for (double share : o.link_shares) {
      if (!(share > 0 && share <= 1))
        throw config_error("data parallel planning: a link share must be in (0, 1], got " + std::to_string(share));
      hw_profile seen = hw;  // the link as the planner may count on it
      seen.h2d_bytes_per_s *= share;
      seen.d2h_bytes_per_s *= share;
      plan p = planner->make_plan(r.t, rep, seen, budget);
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
  return best;
}

}  // namespace spillway::offload
